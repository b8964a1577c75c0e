"""gpufleet settings: everything comes from the environment, with defaults that run
on one machine (SQLite and the embedded file broker) and refuse to run insecurely
in production (no default SECRET_KEY unless DEBUG)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import dj_database_url

from gpufleet.env import env_bool, env_float, env_int, env_list

BASE_DIR = Path(__file__).resolve().parent.parent

# Where the embedded defaults keep their state: the SQLite file, the file broker,
# beat schedules. One folder, so a fresh start is `rm -r var/`.
DATA_DIR = Path(os.environ.get("GPUFLEET_DATA_DIR", BASE_DIR / "var")).resolve()

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("GPUFLEET_REQUIRE_SECRET_KEY", False):
        raise RuntimeError("SECRET_KEY must be set in production")
    # Single-machine default: a key generated once and kept beside the database,
    # so sessions survive restarts without anyone shipping a known key.
    from gpufleet.env import local_secret_key

    SECRET_KEY = local_secret_key(DATA_DIR / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# A CSRF failure on /api/ answers JSON; elsewhere Django's own page.
CSRF_FAILURE_VIEW = "gpufleet.api.views.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.admin",
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
    "gpufleet.core",
    "gpufleet.agent",
    "gpufleet.fleet",
    "gpufleet.claims",
    "gpufleet.jobs",
    "gpufleet.audit",
    "gpufleet.ingest",
    "gpufleet.api",
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
    "gpufleet.core.middleware.LoginRequiredHtmxMiddleware",
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
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "gpufleet": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    },
}

# --- gpufleet --------------------------------------------------------------

GPUFLEET_NODE_NAME = os.environ.get("GPUFLEET_NODE_NAME") or socket.gethostname()
GPUFLEET_COLLECT_INTERVAL = env_float("GPUFLEET_COLLECT_INTERVAL", 30.0, minimum=1.0)
# Out-of-range values are ignored by the diagnosis itself (it falls back to 90).
GPUFLEET_VRAM_WARN_PERCENT = env_float("GPUFLEET_VRAM_WARN_PERCENT", 90.0)
# A GPU at or above this temperature warns even before it throttles.
GPUFLEET_TEMPERATURE_WARN_C = env_float("GPUFLEET_TEMPERATURE_WARN_C", 85.0, minimum=1.0)
# Xid errors older than this no longer count against a GPU.
GPUFLEET_XID_WINDOW_HOURS = env_float("GPUFLEET_XID_WINDOW_HOURS", 24.0, minimum=0.1)
# PATH, DOCKER_HOST (default unix:///var/run/docker.sock) and GPUFLEET_CDI_SPEC_DIRS
# (default /etc/cdi:/var/run/cdi) are read by the agent at each collection.
GPUFLEET_DOCKER_TIMEOUT = env_float("GPUFLEET_DOCKER_TIMEOUT", 5.0, minimum=0.1)
# A node counts as offline after this many collect intervals without a snapshot.
GPUFLEET_OFFLINE_AFTER_INTERVALS = 3
GPUFLEET_HISTORY_RETENTION_HOURS = env_float("GPUFLEET_HISTORY_RETENTION_HOURS", 48.0, minimum=1.0)
# Finding codes this host's agent may fix when asked (comma-separated); none by default.
GPUFLEET_AGENT_FIXES = env_list("GPUFLEET_AGENT_FIXES", [])
# How long "diagnose now" waits for the node before saying it did not answer.
GPUFLEET_JOB_TIMEOUT = env_float("GPUFLEET_JOB_TIMEOUT", 60.0, minimum=1.0)

# --- Celery ------------------------------------------------------------------

BROKER_DIR = DATA_DIR / "broker"
# With CELERY_BROKER_URL unset, `up` runs a private Redis on this socket when redis-server
# is installed (else the file broker) and tells its processes; a command started beside
# it with the same GPUFLEET_DATA_DIR finds the socket here and uses that Redis too.
PRIVATE_REDIS_SOCKET = DATA_DIR / "redis.sock"
PRIVATE_REDIS_URL = f"redis+socket://{PRIVATE_REDIS_SOCKET}"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or (
    PRIVATE_REDIS_URL if PRIVATE_REDIS_SOCKET.is_socket() else "fsq://"
)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_TIMEOUT = env_float("CELERY_BROKER_CONNECTION_TIMEOUT", 4.0)
CELERY_BROKER_TRANSPORT_OPTIONS = (
    {"folder": str(BROKER_DIR)} if CELERY_BROKER_URL.startswith("fsq://") else {}
)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 120
CELERY_TASK_SOFT_TIME_LIMIT = 100
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "ingest"
CELERY_TASK_ROUTES = {
    "gpufleet.fleet.tasks.*": {"queue": "ingest"},
    "gpufleet.jobs.tasks.*": {"queue": "ingest"},
    # Agent tasks are always sent with an explicit queue="node.<name>".
}
# The file broker has no fanout worth paying for: no remote control, no events.
CELERY_WORKER_ENABLE_REMOTE_CONTROL = not CELERY_BROKER_URL.startswith("fsq://")
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# GPUFLEET_ROLE picks whose beat schedule this process runs: the node agent's
# (collect this host) or the central site's (offline marking, pruning).
GPUFLEET_ROLE = os.environ.get("GPUFLEET_ROLE", "central")
if GPUFLEET_ROLE not in ("central", "agent"):
    raise RuntimeError(f"GPUFLEET_ROLE must be 'central' or 'agent', not {GPUFLEET_ROLE!r}")
if GPUFLEET_ROLE == "agent":
    CELERY_BEAT_SCHEDULE = {
        "collect": {
            "task": "gpufleet.agent.tasks.collect",
            "schedule": GPUFLEET_COLLECT_INTERVAL,
            "options": {"queue": f"node.{GPUFLEET_NODE_NAME}", "expires": GPUFLEET_COLLECT_INTERVAL},
        },
    }
else:
    CELERY_BEAT_SCHEDULE = {
        "mark-offline": {
            "task": "gpufleet.fleet.tasks.mark_offline",
            "schedule": GPUFLEET_COLLECT_INTERVAL,
            "options": {"expires": GPUFLEET_COLLECT_INTERVAL},
        },
        "prune-history": {
            "task": "gpufleet.fleet.tasks.prune_history",
            "schedule": 3600.0,
        },
        "expire-jobs": {
            "task": "gpufleet.jobs.tasks.expire_jobs",
            "schedule": 10.0,
            "options": {"expires": 10.0},
        },
    }
