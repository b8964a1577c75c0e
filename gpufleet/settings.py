"""gpufleet settings: everything comes from the environment, with defaults that run
on one machine (SQLite and a private Redis that `up` runs) and refuse to run insecurely
in production (no default SECRET_KEY unless DEBUG)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF

from gpufleet.core import agent_settings
from gpufleet.env import (
    KEY_COMMAND,
    SettingError,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_prices,
    require_strong_secret,
)
from gpufleet.sso import ldap_settings, oidc_settings
from gpufleet.sso.groups import RoleGroupsError, TeamGroupsError, parse_role, parse_role_groups, parse_team_groups

BASE_DIR = Path(__file__).resolve().parent.parent

# Where the embedded defaults keep their state: the SQLite file, the private Redis's
# socket and append-only file, beat schedules. One folder, so a fresh start is `rm -r var/`.
DATA_DIR = agent_settings.data_dir()

DEBUG = env_bool("DEBUG", False)
# Production is said, never guessed: the central site's environment file sets
# GPUFLEET_PRODUCTION=true. Everything else (tests, `up`, `doctor` on a host, a demo)
# runs with the single-machine defaults below. Production refuses DEBUG and a missing
# or placeholder SECRET_KEY, and turns the HTTPS settings on by default.
PRODUCTION = env_bool("GPUFLEET_PRODUCTION", False)
if PRODUCTION and DEBUG:
    raise SettingError("DEBUG must be off in production (GPUFLEET_PRODUCTION=true)")
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if SECRET_KEY.startswith("CHANGE-ME") and PRODUCTION:
    raise SettingError(f"SECRET_KEY is still the example's placeholder: make one with: {KEY_COMMAND}")
if SECRET_KEY and PRODUCTION:
    # Node keys derive from it too, and one signed message read off the broker lets anyone
    # test guesses offline: a short key falls.
    require_strong_secret("SECRET_KEY", SECRET_KEY)
if not SECRET_KEY:
    if PRODUCTION:
        raise SettingError("SECRET_KEY must be set in production")
    # Single-machine default: a key generated once and kept beside the database,
    # so sessions survive restarts without anyone shipping a known key.
    from gpufleet.env import local_secret_key

    SECRET_KEY = local_secret_key(DATA_DIR / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# A CSRF failure on /api/ answers JSON; elsewhere Django's own page.
CSRF_FAILURE_VIEW = "gpufleet.api.views.csrf_failure"

INSTALLED_APPS = [
    # Django's admin with our site: the admin role may enter (gpufleet/core/admin_site.py).
    "gpufleet.core.admin_config.FleetAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_filters",
    # Serves the OpenAPI docs page's Swagger UI from our own static files.
    "ninja",
    "template_partials",
    "axes",
    "csp",
    "gpufleet.core",
    "gpufleet.agent",
    "gpufleet.fleet",
    "gpufleet.teams",
    "gpufleet.claims",
    "gpufleet.jobs",
    "gpufleet.audit",
    "gpufleet.events",
    "gpufleet.usage",
    "gpufleet.alerts",
    "gpufleet.sso",
    "gpufleet.ingest",
    "gpufleet.api",
    # Installed only so that manage.py finds `bench` and `simulate`: the site loads the
    # empty package, never the tools themselves.
    "gpufleet.tools",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Only when GPUFLEET_REMOTE_USER_HEADER is set: logs in whom a trusted proxy names.
    "gpufleet.sso.proxy.TrustedProxyMiddleware",
    # Logs out a person the directory, asked again, gives no role any more.
    "gpufleet.sso.recheck.RecheckMiddleware",
    "gpufleet.core.middleware.LoginRequiredHtmxMiddleware",
    "csp.middleware.CSPMiddleware",
    "gpufleet.core.middleware.RefuseNulMiddleware",
    # Last, as django-axes asks: it turns a lockout raised during login into its response.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "gpufleet.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "gpufleet.core.access.access_context",
            ],
        },
    },
]

WSGI_APPLICATION = "gpufleet.wsgi.application"
# Where `manage.py web` (gunicorn) listens, and how many worker processes serve (the
# --bind and --workers of `web`, and of `up` its --bind and --web-workers, override them).
GPUFLEET_BIND = os.environ.get("GPUFLEET_BIND", "127.0.0.1:8000")
GPUFLEET_WEB_WORKERS = env_int("GPUFLEET_WEB_WORKERS", 2, minimum=1)
# Requests each worker serves at once, a thread each (gunicorn's gthread worker): a long
# export holds one thread, not its worker.
GPUFLEET_WEB_THREADS = env_int("GPUFLEET_WEB_THREADS", 4, minimum=1)
# Seconds a worker may go without checking in before gunicorn kills it as stuck. A gthread
# worker checks in about once a second while its threads serve, so a long response is
# never killed for its length; under 2 s an idle worker could miss it.
GPUFLEET_WEB_TIMEOUT = env_int("GPUFLEET_WEB_TIMEOUT", 30, minimum=2)

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'gpufleet.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, ingest worker, beat) share one SQLite file: wait for
    # the write lock instead of failing with "database is locked", and take it up
    # front so a read-then-write transaction cannot deadlock.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # A file, not memory, so worker processes started by integration tests see it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

# Login throttling (django-axes): after GPUFLEET_LOGIN_FAILURE_LIMIT wrong passwords for
# one username from one address, that pair is locked out for GPUFLEET_LOGIN_LOCKOUT_MINUTES
# (the pair, so nobody can lock a colleague out from elsewhere); the login page says so
# (registration/locked_out.html) and the lockout is audited (gpufleet/audit/receivers.py).
# Axes' backend comes first and needs the request, which Django's login view passes.
# Local passwords (gpufleet/sso/backends.py), then each single sign-on way that is set up
# below (docs/sso.md): every one of them goes through the throttle.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "gpufleet.sso.backends.LocalBackend"]
AXES_FAILURE_LIMIT = env_int("GPUFLEET_LOGIN_FAILURE_LIMIT", 5)
if AXES_FAILURE_LIMIT < 1:
    raise SettingError(f"GPUFLEET_LOGIN_FAILURE_LIMIT={AXES_FAILURE_LIMIT} must be at least 1")
AXES_COOLOFF_TIME = timedelta(minutes=env_float("GPUFLEET_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=1.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# The name tried, cut to the longest a user's may be (gpufleet/core/login.py).
AXES_USERNAME_CALLABLE = "gpufleet.core.login.throttled_username"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
# Who the client is, for the throttle and /metrics (gpufleet/core/security.py): the peer's
# address, unless the peer is one of GPUFLEET_TRUSTED_PROXIES (addresses or CIDRs; none by
# default); then the right-most X-Forwarded-For address that is not one of them.
AXES_CLIENT_IP_CALLABLE = "gpufleet.core.security.client_ip"
GPUFLEET_TRUSTED_PROXIES = env_networks("GPUFLEET_TRUSTED_PROXIES")

# Single sign-on (docs/sso.md): which directory groups give which role, re-read at every
# login; a person in none gets no access unless GPUFLEET_SSO_DEFAULT_ROLE names a role.
try:
    GPUFLEET_SSO_ROLE_GROUPS = parse_role_groups(os.environ.get("GPUFLEET_SSO_ROLE_GROUPS", ""))
    GPUFLEET_SSO_DEFAULT_ROLE = parse_role(os.environ["GPUFLEET_SSO_DEFAULT_ROLE"]) \
        if os.environ.get("GPUFLEET_SSO_DEFAULT_ROLE", "").strip() else ""
except RoleGroupsError as error:
    raise SettingError(f"GPUFLEET_SSO_ROLE_GROUPS / GPUFLEET_SSO_DEFAULT_ROLE: {error}") from None
# Which directory groups give which teams (a person's directory memberships follow them at
# every login and re-check; memberships an admin added by hand stay).
try:
    GPUFLEET_SSO_TEAM_GROUPS = parse_team_groups(os.environ.get("GPUFLEET_SSO_TEAM_GROUPS", ""))
except TeamGroupsError as error:
    raise SettingError(f"GPUFLEET_SSO_TEAM_GROUPS: {error}") from None
# The directory is asked again about a signed-in person at most this often, when they use
# the site (a page or an API token) and from the beat when they do not (gpufleet/sso/recheck.py).
GPUFLEET_SSO_RECHECK_S = env_int("GPUFLEET_SSO_RECHECK_S", 900, minimum=60)
# Whom the no-access page tells a refused person to ask.
GPUFLEET_SSO_CONTACT = os.environ.get("GPUFLEET_SSO_CONTACT", "").strip() or "an admin of this gpufleet site"
# false: only single sign-on logs people in, and a superuser made with `manage.py
# createsuperuser` keeps a password for when the directory is down.
GPUFLEET_LOCAL_LOGIN = env_bool("GPUFLEET_LOCAL_LOGIN", True)

# An authenticating proxy in front (oauth2-proxy: X-Forwarded-User, X-Forwarded-Groups,
# X-Forwarded-Email; Authelia: Remote-User, Remote-Groups, Remote-Email), believed only from
# GPUFLEET_TRUSTED_PROXIES.
GPUFLEET_REMOTE_USER_HEADER = os.environ.get("GPUFLEET_REMOTE_USER_HEADER", "").strip()
GPUFLEET_REMOTE_GROUPS_HEADER = os.environ.get("GPUFLEET_REMOTE_GROUPS_HEADER", "").strip()
GPUFLEET_REMOTE_EMAIL_HEADER = os.environ.get("GPUFLEET_REMOTE_EMAIL_HEADER", "").strip()
if GPUFLEET_REMOTE_USER_HEADER:
    if not GPUFLEET_TRUSTED_PROXIES:
        raise SettingError("GPUFLEET_REMOTE_USER_HEADER needs GPUFLEET_TRUSTED_PROXIES: the addresses of the proxy "
                           "whose header is believed (from anyone else it is a header a client wrote)")
    AUTHENTICATION_BACKENDS.append("gpufleet.sso.proxy.ProxyBackend")

# LDAP / Active Directory (docs/sso.md#ldap-and-active-directory): the login form's
# passwords checked by the directory when GPUFLEET_LDAP_URI is set. The GPUFLEET_LDAP_*
# variables become django-auth-ldap's AUTH_LDAP_* settings here (gpufleet/sso/ldap_settings.py,
# which refuses bad values); python-ldap is loaded only then.
GPUFLEET_LDAP_URI = os.environ.get("GPUFLEET_LDAP_URI", "").strip()
if GPUFLEET_LDAP_URI:
    globals().update(ldap_settings.read())
    AUTHENTICATION_BACKENDS.append("gpufleet.sso.ldap.LDAPLoginBackend")

# OpenID Connect (docs/sso.md#openid-connect): a "Log in with …" button when
# GPUFLEET_OIDC_ISSUER is set (gpufleet/sso/oidc_settings.py refuses bad values). The
# provider's endpoints come from its discovery document at the first login, not at start-up.
_OIDC = oidc_settings.read()
globals().update(_OIDC)
if _OIDC["GPUFLEET_OIDC_ISSUER"]:
    AUTHENTICATION_BACKENDS.append("gpufleet.sso.oidc.OIDCBackend")
# The OpenID provider's answers and the authenticating proxy's header are not password
# guesses (each throttles its own login form): a person they name who is in no mapped group
# must not lock that address (the proxy's: everyone's) out of the next login.
AXES_WHITELIST_CALLABLE = "gpufleet.sso.backends.unthrottled"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet:overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = os.environ.get("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Static files are served by whitenoise straight from the apps' folders (finders),
# so no collectstatic step is needed; set STATIC_ROOT only to collect them.
STATIC_ROOT = os.environ.get("STATIC_ROOT") or None
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
# HTTPS: on by default in production, which sits behind a TLS proxy; each can be set alone.
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", PRODUCTION)
# A load balancer's health probe may speak plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
# The directive alone submits nothing: the preload list takes only the domain owner's request.
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", PRODUCTION)
# "HTTP_X_FORWARDED_PROTO,https": the header by which the TLS proxy says the request came
# over HTTPS. Set it only when that proxy overwrites the header (nginx: proxy_set_header).
_PROXY_SSL_HEADER = env_list("SECURE_PROXY_SSL_HEADER", [])
if _PROXY_SSL_HEADER and len(_PROXY_SSL_HEADER) != 2:
    raise SettingError(
        f"SECURE_PROXY_SSL_HEADER={os.environ['SECURE_PROXY_SSL_HEADER']!r} must be a header and "
        "its value, e.g. HTTP_X_FORWARDED_PROTO,https"
    )
SECURE_PROXY_SSL_HEADER = tuple(_PROXY_SSL_HEADER) or None
# Content-Security-Policy (django-csp): our own scripts and styles only, none inline, so
# injected markup cannot run. Templates carry no style= or on…= attributes (a test checks);
# htmx's indicator style lives in app.css (base.html turns off htmx's injected one).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

if _OIDC["GPUFLEET_OIDC_ISSUER"]:
    CONTENT_SECURITY_POLICY = oidc_settings.allow_logout_at_provider(CONTENT_SECURITY_POLICY,
                                                                     _OIDC["GPUFLEET_OIDC_ISSUER"])

# Every process's logging, the agent's too (agent_settings.logging_config says how).
LOGGING = agent_settings.logging_config()

# --- gpufleet --------------------------------------------------------------

# What the agent reads too, by the same rules (gpufleet/core/agent_settings.py): the
# agent process takes it from there, without these settings.
_AGENT = agent_settings.from_environment()
GPUFLEET_NODE_NAME = _AGENT.GPUFLEET_NODE_NAME
GPUFLEET_COLLECT_INTERVAL = _AGENT.GPUFLEET_COLLECT_INTERVAL
GPUFLEET_VRAM_WARN_PERCENT = _AGENT.GPUFLEET_VRAM_WARN_PERCENT
# A GPU at or above this temperature warns even before it throttles.
GPUFLEET_TEMPERATURE_WARN_C = _AGENT.GPUFLEET_TEMPERATURE_WARN_C
# Xid errors older than this no longer count against a GPU.
GPUFLEET_XID_WINDOW_HOURS = _AGENT.GPUFLEET_XID_WINDOW_HOURS
# A GPU held down by power capping or heat for more than this share of the last hour warns.
GPUFLEET_THROTTLE_WARN_SHARE = _AGENT.GPUFLEET_THROTTLE_WARN_SHARE
# PATH, DOCKER_HOST (default unix:///var/run/docker.sock) and GPUFLEET_CDI_SPEC_DIRS
# (default /etc/cdi:/var/run/cdi) are read by the agent at each collection.
GPUFLEET_DOCKER_TIMEOUT = _AGENT.GPUFLEET_DOCKER_TIMEOUT
# A node counts as offline after this many collect intervals without a snapshot.
GPUFLEET_OFFLINE_AFTER_INTERVALS = 3
# The overview turns its "not reporting" tile and finding to an alarm once more than
# this share (percent) of the enrolled nodes stopped reporting.
GPUFLEET_OFFLINE_ALARM_PERCENT = env_float("GPUFLEET_OFFLINE_ALARM_PERCENT", 10.0, minimum=0.0)
# The overview's tiles, fleet findings and driver versions are computed at most once per
# this many seconds and shared by every view and poll (gpufleet/fleet/summary_keep.py);
# keep it under the summary's 10 s refresh. 0 computes them for every view.
GPUFLEET_SUMMARY_MAX_AGE_S = env_float("GPUFLEET_SUMMARY_MAX_AGE_S", 5.0, minimum=0.0)
# The Free GPUs page's counts and find a slot's answers are computed at most once per this
# many seconds (per step, per request) and shared by every view; a claim saved, a maintenance
# window or the hour turning drops them at once. 0 computes them for every view.
GPUFLEET_AVAILABILITY_MAX_AGE_S = env_float("GPUFLEET_AVAILABILITY_MAX_AGE_S", 30.0, minimum=0.0)
# Whether the central beat deletes claims past their end (audited, by "system"); off,
# ended claims are only flagged. An ended claim holds no GPU either way.
GPUFLEET_RELEASE_EXPIRED = env_bool("GPUFLEET_RELEASE_EXPIRED", False)
# The longest window a claim with an end may have, in days: a booking cannot lock GPUs for months.
GPUFLEET_MAX_RESERVATION_DAYS = env_int("GPUFLEET_MAX_RESERVATION_DAYS", 30, minimum=1)
# How far a repeating booking may go: none of its occurrences starts later than this many
# days after its first (a term of weekly labs fits).
GPUFLEET_MAX_SERIES_DAYS = env_int("GPUFLEET_MAX_SERIES_DAYS", 366, minimum=1)
# A claimed GPU is "claimed but idle" once it has had no process and stayed under this
# utilization in every snapshot for this many hours.
GPUFLEET_IDLE_UTIL_PERCENT = env_float("GPUFLEET_IDLE_UTIL_PERCENT", 5.0, minimum=0.0)
GPUFLEET_IDLE_HOURS = env_float("GPUFLEET_IDLE_HOURS", 24.0, minimum=0.0001)
# The central beat tells an idle claim's owner (gpufleet/usage/idle.py); with RELEASE_IDLE
# it releases the claim (audited, by "system") once it stayed idle GRACE_HOURS after that.
GPUFLEET_IDLE_GRACE_HOURS = env_float("GPUFLEET_IDLE_GRACE_HOURS", 24.0, minimum=0.0)
GPUFLEET_RELEASE_IDLE = env_bool("GPUFLEET_RELEASE_IDLE", False)
# A booking (a claim made before its start) none of whose GPUs did work in this many hours
# from its start is a no-show: flagged idle then, its owner told, and released GRACE_HOURS
# later whatever RELEASE_IDLE says; 0 leaves bookings to the idle rule alone.
GPUFLEET_NO_SHOW_HOURS = env_float("GPUFLEET_NO_SHOW_HOURS", 2.0, minimum=0.0)
# Email to claim owners (idle claims, reminders, monthly usage reports) goes through this SMTP server;
# with no host set none is sent (the alert channels still hear of the events).
EMAIL_HOST = os.environ.get("GPUFLEET_EMAIL_HOST", "").strip()
EMAIL_PORT = env_int("GPUFLEET_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = os.environ.get("GPUFLEET_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("GPUFLEET_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("GPUFLEET_EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = os.environ.get("GPUFLEET_EMAIL_FROM", "").strip() or "gpufleet@localhost"
# A server that stops answering must not hold the beat's worker past its task time limit.
EMAIL_TIMEOUT = 30
# Per-GPU history: raw samples for hours, five-minute rollups for days, hourly ones
# for months (gpufleet/fleet/history.py).
GPUFLEET_HISTORY_RAW_HOURS = env_float("GPUFLEET_HISTORY_RAW_HOURS", 6.0, minimum=1.0)
GPUFLEET_HISTORY_5M_DAYS = env_float("GPUFLEET_HISTORY_5M_DAYS", 7.0, minimum=1.0)
GPUFLEET_HISTORY_HOURLY_DAYS = env_float("GPUFLEET_HISTORY_HOURLY_DAYS", 90.0, minimum=1.0)
# Usage accounting (gpufleet/usage/): five-minute rows until rolled, hourly rows for reports.
GPUFLEET_USAGE_5M_HOURS = env_float("GPUFLEET_USAGE_5M_HOURS", 24.0, minimum=2.0)
GPUFLEET_USAGE_DAYS = env_float("GPUFLEET_USAGE_DAYS", 400.0, minimum=1.0)
# Chargeback: a price per GPU-hour held, by GPU model ("MODEL=PRICE;...;*=PRICE"), and
# per kWh; unset, usage reports show no cost.
GPUFLEET_PRICE_GPU_HOUR = env_prices("GPUFLEET_PRICE_GPU_HOUR")
GPUFLEET_PRICE_KWH = env_float("GPUFLEET_PRICE_KWH", None, minimum=0.0)  # type: ignore[arg-type]
GPUFLEET_CURRENCY = os.environ.get("GPUFLEET_CURRENCY", "").strip()[:8]
# Events (gpufleet/events, docs/events.md): a condition opens an event once it held this
# long, and closes it once it stayed clear this long (a condition back sooner continues
# it); closed events are kept this many days. Detection at ingest can be turned off.
GPUFLEET_EVENT_OPEN_AFTER_S = env_float("GPUFLEET_EVENT_OPEN_AFTER_S", 0.0, minimum=0.0)
GPUFLEET_EVENT_CLOSE_AFTER_S = env_float("GPUFLEET_EVENT_CLOSE_AFTER_S", float(GPUFLEET_COLLECT_INTERVAL), minimum=0.0)
GPUFLEET_EVENT_RETENTION_DAYS = env_float("GPUFLEET_EVENT_RETENTION_DAYS", 365.0, minimum=1.0)
GPUFLEET_EVENTS_AT_INGEST = env_bool("GPUFLEET_EVENTS_AT_INGEST", True)
# The site hears nothing once no snapshot was stored this long while nodes are enrolled:
# an ingest-silent event, and /healthz answers 503 (gpufleet/fleet/ingest_health.py). At
# least two collect intervals, so that a one-node site's pause between snapshots is not one.
GPUFLEET_INGEST_SILENCE_ALERT_S = env_float("GPUFLEET_INGEST_SILENCE_ALERT_S",
                                            max(300.0, 2 * GPUFLEET_COLLECT_INTERVAL), minimum=1.0)
# Alerts (gpufleet/alerts, docs/alerts.md): the central beat plans and sends them every
# TICK_S; events due within GROUP_S of each other go as one notification per rule and
# channel; a failed send is tried again RETRY_S later, doubling up to RETRY_MAX_S, while
# any of its events is open and for GIVE_UP_HOURS after they all closed; a send claimed
# longer than CLAIM_TIMEOUT_S ago (its sender died) is taken again, so keep it longer
# than any send may take. Links in notifications start with SITE_URL.
GPUFLEET_ALERT_TICK_S = env_float("GPUFLEET_ALERT_TICK_S", 10.0, minimum=1.0)
GPUFLEET_ALERT_GROUP_S = env_float("GPUFLEET_ALERT_GROUP_S", 30.0, minimum=0.0)
GPUFLEET_ALERT_RETRY_S = env_float("GPUFLEET_ALERT_RETRY_S", 60.0, minimum=1.0)
GPUFLEET_ALERT_RETRY_MAX_S = env_float("GPUFLEET_ALERT_RETRY_MAX_S", 1800.0, minimum=1.0)
GPUFLEET_ALERT_GIVE_UP_HOURS = env_float("GPUFLEET_ALERT_GIVE_UP_HOURS", 24.0, minimum=0.0)
GPUFLEET_ALERT_CLAIM_TIMEOUT_S = env_float("GPUFLEET_ALERT_CLAIM_TIMEOUT_S", 300.0, minimum=10.0)
# A channel reaches no loopback, link-local, private or reserved address (its admin could
# probe the centre's own network) unless allowed here: hosts by name, address or CIDR.
GPUFLEET_ALERT_ALLOW_PRIVATE = env_bool("GPUFLEET_ALERT_ALLOW_PRIVATE", False)
GPUFLEET_ALERT_ALLOW_HOSTS = env_list("GPUFLEET_ALERT_ALLOW_HOSTS", [])
GPUFLEET_SITE_URL = os.environ.get("GPUFLEET_SITE_URL") or f"http://{GPUFLEET_BIND}"
# The longest maintenance the operator role may set (it mutes the node's alerts); longer is the admin role's.
GPUFLEET_MAINTENANCE_MAX_DAYS = env_int("GPUFLEET_MAINTENANCE_MAX_DAYS", 30, minimum=1)
# Finding codes this host's agent may fix when asked (comma-separated); none by default.
GPUFLEET_AGENT_FIXES = _AGENT.GPUFLEET_AGENT_FIXES
# How long "diagnose now" waits for the node before saying it did not answer.
GPUFLEET_JOB_TIMEOUT = _AGENT.GPUFLEET_JOB_TIMEOUT
# The longest a DCGM diagnostic may run on a node (docs/diagnostics.md); a diagnostic job
# is unanswered only after the job timeout and this.
GPUFLEET_DCGM_DIAG_TIMEOUT = _AGENT.GPUFLEET_DCGM_DIAG_TIMEOUT

# Node identity (wire.sign / wire.verify). The centre derives each node's key from
# GPUFLEET_SIGNING_KEY (by default SECRET_KEY) with wire.derive_node_key; changing it re-keys
# every node.
if os.environ.get("GPUFLEET_SIGNING_KEY") and PRODUCTION:
    require_strong_secret("GPUFLEET_SIGNING_KEY", os.environ["GPUFLEET_SIGNING_KEY"])
GPUFLEET_SIGNING_KEY = (os.environ.get("GPUFLEET_SIGNING_KEY") or SECRET_KEY).encode()
# This agent's key, as `manage.py enroll NODE` prints it; `up` leaves its local agents'
# keys in the data dir instead, readable by their user only.
GPUFLEET_AGENT_KEY = _AGENT.GPUFLEET_AGENT_KEY

# --- /metrics ------------------------------------------------------------------

# Addresses (IPs or CIDRs, comma-separated) that may scrape /metrics without a token;
# none by default: a scraper then needs an API token.
GPUFLEET_METRICS_ALLOWED_ADDRESSES = env_networks("GPUFLEET_METRICS_ALLOWED_ADDRESSES")
# The ingest counters are counted in the worker and read by the web's scrape: both meet
# in prometheus-client's multiprocess files here (gpufleet/ingest/metrics.py says why).
# Set before anything imports prometheus-client, which reads it once on import.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(DATA_DIR / "metrics"))
GPUFLEET_METRICS_DIR = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
GPUFLEET_METRICS_DIR.mkdir(parents=True, exist_ok=True)

# --- Celery ------------------------------------------------------------------

# With CELERY_BROKER_URL unset, `up` runs a private Redis on this socket and tells its
# processes; a command started beside it with the same GPUFLEET_DATA_DIR finds that
# Redis here too. The same engine as production: there is no broker of our own.
PRIVATE_REDIS_SOCKET = _AGENT.PRIVATE_REDIS_SOCKET
# That Redis has no default user, as production's should not: the central processes log in
# as the centre's user, with the password kept here (made once by `up`; its aclfile holds the hash).
PRIVATE_REDIS_PASSWORD_FILE = _AGENT.PRIVATE_REDIS_PASSWORD_FILE
PRIVATE_REDIS_ACLFILE = DATA_DIR / "redis-users.acl"
CELERY_BROKER_URL = _AGENT.CELERY_BROKER_URL
CELERY_BROKER_CONNECTION_TIMEOUT = _AGENT.CELERY_BROKER_CONNECTION_TIMEOUT
# Serialisation (JSON only), compression, time limits, acks, reconnecting: the options the
# agent's Celery app uses too, kept once (agent_settings.CELERY_SHARED).
globals().update({f"CELERY_{name.upper()}": value for name, value in agent_settings.CELERY_SHARED.items()})
# A message a worker took and never acknowledged (killed mid-task) goes back to its
# queue after this many seconds. Keep it longer than any task may run
# (CELERY_TASK_TIME_LIMIT, 120 s), or a slow task is handed to a second worker while the
# first still runs it (not harmless for fixes). An ingest stream entry a consumer took
# and never acknowledged is taken over by another consumer after as long (a repeat
# there is a stale snapshot, ignored).
GPUFLEET_BROKER_VISIBILITY_TIMEOUT = _AGENT.GPUFLEET_BROKER_VISIBILITY_TIMEOUT
CELERY_BROKER_TRANSPORT_OPTIONS = agent_settings.broker_transport_options(GPUFLEET_BROKER_VISIBILITY_TIMEOUT)
# Celery's Django fixup closes the database connection after every task unless told
# to reuse it: at 1 connection per snapshot that cost ingest 4/5 of its speed.
CELERY_DB_REUSE_MAX = 1000
# Central tasks go to the housekeeping worker (routes below); agents' to their node's queue.
CELERY_TASK_DEFAULT_QUEUE = "housekeeping"
# Agents append what they send to this Redis stream; `manage.py ingest` consumes it
# (gpufleet/ingest/stream.py). Agents trim it to about MAXLEN entries as they append:
# the consumers delete what they stored, so only a backlog that long is ever trimmed,
# and the consumers log and /metrics counts what was (gpufleet_ingest_stream_trimmed).
GPUFLEET_INGEST_STREAM = _AGENT.GPUFLEET_INGEST_STREAM
GPUFLEET_INGEST_STREAM_MAXLEN = _AGENT.GPUFLEET_INGEST_STREAM_MAXLEN
# A consumer stores up to this many entries in one transaction, and waits up to
# BLOCK_MS for the first of a batch (also how long SIGTERM may wait for it to notice).
# Keep the batch well below what it can store within the visibility timeout.
GPUFLEET_INGEST_BATCH = env_int("GPUFLEET_INGEST_BATCH", 200, minimum=1)
GPUFLEET_INGEST_BLOCK_MS = env_int("GPUFLEET_INGEST_BLOCK_MS", 1000, minimum=1)
# Messages the ingest accepts from one node per GPUFLEET_COLLECT_INTERVAL (its snapshot,
# and a few for jobs); more are refused and counted (gpufleet/ingest/admission.py).
GPUFLEET_INGEST_CAP_PER_INTERVAL = env_int("GPUFLEET_INGEST_CAP_PER_INTERVAL", 4, minimum=1)
# What agents send goes to the ingest stream; the central beat's own work goes to
# "housekeeping", read by the beat's process alone (launch.central_beat), so an hour's
# prune never delays ingest. Agent tasks are always sent with an explicit queue="node.<name>".
HOUSEKEEPING_QUEUE = "housekeeping"
CELERY_TASK_ROUTES = {
    "gpufleet.fleet.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
    "gpufleet.jobs.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
    "gpufleet.claims.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
    "gpufleet.events.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
    "gpufleet.alerts.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
    "gpufleet.sso.tasks.*": {"queue": HOUSEKEEPING_QUEUE},
}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# The central beat's schedule (launch.central_beat); each agent has its own (agent_settings).
CELERY_BEAT_SCHEDULE = {
    "mark-offline": {
        "task": "gpufleet.fleet.tasks.mark_offline",
        "schedule": GPUFLEET_COLLECT_INTERVAL,
        "options": {"expires": GPUFLEET_COLLECT_INTERVAL},
    },
    # Every five minutes: the finished five-minute buckets (gpufleet/fleet/history.py).
    "roll-history": {
        "task": "gpufleet.fleet.tasks.roll_history",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
    # Every five minutes: the finished hours' usage rolled up (gpufleet/usage/rollup.py).
    "roll-usage": {
        "task": "gpufleet.usage.tasks.roll_usage",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
    "prune-usage": {
        "task": "gpufleet.usage.tasks.prune_usage",
        "schedule": 3600.0,
    },
    "prune-history": {
        "task": "gpufleet.fleet.tasks.prune_history",
        "schedule": 3600.0,
    },
    # Single sign-on users not asked lately (token-only ones too) asked again (gpufleet/sso/recheck.py).
    "sso-recheck": {
        "task": "gpufleet.sso.tasks.recheck_directory",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
    "expire-jobs": {
        "task": "gpufleet.jobs.tasks.expire_jobs",
        "schedule": 10.0,
        "options": {"expires": 10.0},
    },
    # Does nothing unless GPUFLEET_RELEASE_EXPIRED is true.
    "release-expired-claims": {
        "task": "gpufleet.claims.tasks.release_expired",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Idle claims: their owners told, and (GPUFLEET_RELEASE_IDLE) released after the grace.
    "idle-claims": {
        "task": "gpufleet.usage.tasks.idle_claims",
        "schedule": GPUFLEET_COLLECT_INTERVAL,
        "options": {"expires": GPUFLEET_COLLECT_INTERVAL},
    },
    # Owners reminded of the claims that start or end within the hour (gpufleet/usage/reminders.py).
    "remind-owners": {
        "task": "gpufleet.usage.tasks.remind_owners",
        "schedule": 60.0,
        "options": {"expires": 60.0},
    },
    # Last month's usage reports, once the month is rolled (gpufleet/usage/monthly.py).
    "monthly-usage-reports": {
        "task": "gpufleet.usage.tasks.monthly_reports",
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
    # Events that stayed clear while nothing observed them close (gpufleet/events/services.py).
    "close-events": {
        "task": "gpufleet.events.tasks.close_cleared",
        "schedule": GPUFLEET_COLLECT_INTERVAL,
        "options": {"expires": GPUFLEET_COLLECT_INTERVAL},
    },
    "prune-events": {
        "task": "gpufleet.events.tasks.prune_events",
        "schedule": 3600.0,
    },
    # Plans and sends the alerts due (gpufleet/alerts/services.py).
    "send-alerts": {
        "task": "gpufleet.alerts.tasks.send_alerts",
        "schedule": GPUFLEET_ALERT_TICK_S,
        "options": {"expires": GPUFLEET_ALERT_TICK_S},
    },
}
