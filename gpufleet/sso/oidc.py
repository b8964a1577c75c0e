"""OpenID Connect login (docs/sso.md#openid-connect), with mozilla-django-oidc: a backend beside
the password ones, and its views for the button, the provider's answer and logout.

What we add to the library, through its public hooks:
- the provider's endpoints from its discovery document (`<issuer>/.well-known/openid-configuration`,
  cached; its "issuer" must be the configured one), asked for at the first login, never at
  start-up, for a password login or for a signed-in user's requests;
- an ID token checked for issuer, audience, expiry, issue time and subject as well as for its
  signature and nonce (the library checks only those two and the expiry);
- users made, matched and given their role from the claims by the single sign-on core
  (services.sign_in); every refusal audited and shown with its reason."""

from __future__ import annotations

import hashlib
import logging
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.core.cache import cache
from django.core.exceptions import SuspiciousOperation
from django.http import Http404
from django.shortcuts import redirect, render, resolve_url
from django.utils.decorators import method_decorator
from django.utils.functional import lazy
from django.views.decorators.cache import never_cache
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView, OIDCLogoutView

from gpufleet.audit.models import Action, record
from gpufleet.sso.backends import ActiveOnly
from gpufleet.sso.models import Identity
from gpufleet.sso.recheck import Gone, Unavailable
from gpufleet.sso.services import REFUSAL_KEY, sign_in

log = logging.getLogger(__name__)

OIDC_BACKEND = "gpufleet.sso.oidc.OIDCBackend"
# A provider's endpoints rarely move; its signing keys (the JWKS) are fetched at each login.
DISCOVERY_CACHE_S = 3600
# Clock difference allowed between the provider and this site when checking exp and iat.
LEEWAY_S = 60
_DOCUMENT_KEYS = ("issuer", "authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
_ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


class ProviderUnavailable(Exception):
    """The provider's discovery document cannot be had, or is not one this site can use."""


class LoginRefused(Exception):
    """A login the provider's answer does not prove (a token or state that does not check
    out); the message says why, for the person and the audit log."""


def configured() -> bool:
    return bool(settings.GPUFLEET_OIDC_ISSUER)


def discovery() -> dict[str, str]:
    """The provider's endpoints, from its discovery document; kept for DISCOVERY_CACHE_S.
    A failure is not kept: the next login asks again."""
    issuer = settings.GPUFLEET_OIDC_ISSUER
    key = "gpufleet:oidc:discovery:" + hashlib.sha256(issuer.encode()).hexdigest()
    document = cache.get(key)
    if document is None:
        document = _fetch_discovery(issuer)
        cache.set(key, document, DISCOVERY_CACHE_S)
    return document


def _fetch_discovery(issuer: str) -> dict[str, str]:
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=settings.GPUFLEET_OIDC_TIMEOUT, verify=_tls_verify())
    except requests.RequestException as error:
        log.warning("OpenID provider discovery at %s failed: %s", url, error)
        raise ProviderUnavailable(f"{url} did not answer ({error.__class__.__name__})") from None
    if answer.status_code != 200:
        raise ProviderUnavailable(f"{url} answered HTTP {answer.status_code}")
    try:
        document = answer.json()
    except ValueError:
        raise ProviderUnavailable(f"{url} did not answer with a JSON document") from None
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"{url} did not answer with a JSON object")
    missing = [name for name in _DOCUMENT_KEYS if not isinstance(document.get(name), str) or not document[name]]
    if missing:
        raise ProviderUnavailable(f"the discovery document at {url} has no {', '.join(missing)}")
    # OpenID Connect Discovery 1.0, 4.3: the issuer must be exactly the one asked about, or
    # a provider could speak for another.
    if document["issuer"] != issuer:
        raise ProviderUnavailable(f"the discovery document at {url} names the issuer {document['issuer']!r}, "
                                  f"not {issuer!r} as GPUFLEET_OIDC_ISSUER says")
    kept = (*_DOCUMENT_KEYS, "end_session_endpoint")
    return {name: document[name] for name in kept if isinstance(document.get(name), str)}


def _tls_verify() -> bool | str:
    return settings.GPUFLEET_OIDC_CA_FILE or True


def _endpoint(name: str) -> str:
    return discovery()[name]


# The library reads the endpoints when a backend or view is made: Django makes a backend
# for every password login and for every request of a signed-in user, so an endpoint is
# looked up only when the library first uses it.
_lazy_endpoint = lazy(_endpoint, str)


def oidc_setting(attr: str, *args):
    """The library's settings (its `get_settings` hook): the provider's endpoints discovered,
    ours from GPUFLEET_OIDC_*, PKCE and nonce always on; anything else from Django's settings."""
    if attr in _ENDPOINTS:
        return _lazy_endpoint(_ENDPOINTS[attr])
    ours = {
        "OIDC_RP_CLIENT_ID": settings.GPUFLEET_OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.GPUFLEET_OIDC_CLIENT_SECRET,
        "OIDC_RP_SIGN_ALGO": settings.GPUFLEET_OIDC_SIGN_ALGO,
        "OIDC_RP_SCOPES": settings.GPUFLEET_OIDC_SCOPES,
        "OIDC_USE_PKCE": True,
        "OIDC_USE_NONCE": True,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "OIDC_VERIFY_SSL": _tls_verify(),
        "OIDC_TIMEOUT": settings.GPUFLEET_OIDC_TIMEOUT,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc:callback",
        # Kept in the session for the provider's logout (its id_token_hint).
        "OIDC_STORE_ID_TOKEN": True,
        "OIDC_OP_LOGOUT_URL_METHOD": "gpufleet.sso.oidc.provider_logout_url",
    }
    if attr in ours:
        return ours[attr]
    return import_from_settings(attr, *args)


class OIDCBackend(ActiveOnly, OIDCAuthenticationBackend):
    """The provider's answer to a login this site started: the code exchanged, the ID token
    checked in full, the user and role from its claims (services.sign_in)."""

    get_settings = staticmethod(oidc_setting)

    def authenticate(self, request, **kwargs):
        # Django offers every login to every backend: only the callback's carries a nonce.
        if request is None or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    grant, refresh_token = "", ""

    def get_token(self, payload):
        """The token endpoint's answer; its refresh token is kept for asking again (groups_of)."""
        self.grant = payload.get("grant_type", "")
        answer = super().get_token(payload)
        token = answer.get("refresh_token") if isinstance(answer, dict) else None
        self.refresh_token = token if isinstance(token, str) else ""
        return answer

    def raise_token_response_error(self, response):
        # RFC 6749 5.2: a 400 or 401 is the provider's answer about this code (one it never
        # issued, used or expired) or refresh token, a refusal; anything else is the provider failing.
        if response.status_code in (400, 401):
            what = "refresh token" if self.grant == "refresh_token" else "login's code"
            raise LoginRefused(f"the provider did not accept the {what} ({_token_error(response)})")
        super().raise_token_response_error(response)

    def get_payload_data(self, token, key):
        """The ID token's claims, once its signature (with the configured algorithm only),
        issuer, audience, expiry and issue time check out; LoginRefused says which did not."""
        issuer, client_id = settings.GPUFLEET_OIDC_ISSUER, settings.GPUFLEET_OIDC_CLIENT_ID
        try:
            payload = jwt.decode(token, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=client_id, issuer=issuer,
                                 leeway=LEEWAY_S, options={"require": ["exp", "iat", "iss", "aud", "sub"]})
        except jwt.ExpiredSignatureError:
            raise LoginRefused("the ID token has expired") from None
        except jwt.InvalidIssuerError:
            claimed = _unverified(token).get("iss")
            raise LoginRefused(f"the ID token was issued by {claimed!r}, not {issuer!r}") from None
        except jwt.InvalidAudienceError:
            claimed = _unverified(token).get("aud")
            raise LoginRefused(f"the ID token is for another client ({claimed!r}), not {client_id!r}") from None
        except jwt.MissingRequiredClaimError as error:
            raise LoginRefused(f"the ID token has no {error.claim} claim") from None
        except jwt.InvalidTokenError as error:
            raise LoginRefused(f"the ID token does not check out ({error})") from None
        # OpenID Connect Core 3.1.3.7: a token for several audiences names us as its holder.
        if isinstance(payload["aud"], list) and len(payload["aud"]) > 1 and payload.get("azp") != client_id:
            raise LoginRefused(f"the ID token was given to {payload.get('azp')!r}, not {client_id!r}")
        return payload

    def verify_token(self, token, **kwargs):
        if not isinstance(token, str) or not token:
            raise LoginRefused("the provider sent no ID token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError as error:
            raise LoginRefused(f"the ID token does not check out ({error})") from None
        # Before the library looks for the key: it needs the header's kid, and the alg
        # must be the configured one (never "none", never the client secret's HS256).
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise LoginRefused(f"the ID token is signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}")
        if not header.get("kid"):
            raise LoginRefused("the ID token names no signing key (no kid in its header)")
        try:
            return super().verify_token(token, **kwargs)
        except SuspiciousOperation as error:
            if "Nonce" in str(error):
                raise LoginRefused("the ID token's nonce is not the one this login sent") from None
            raise LoginRefused(f"the ID token does not check out ({error})") from None

    def get_or_create_user(self, access_token, id_token, payload):
        """The user these claims name, through the single sign-on core; None when it refused
        them (its reason is in the session for the no-access page)."""
        claims = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(claims, dict) or claims.get("sub") != payload["sub"]:
            # OpenID Connect Core 5.3.2: user info about someone else must not be used.
            raise LoginRefused("the provider's user info is not about the user of the ID token")
        claims = {**payload, **claims}
        username = claims.get(settings.GPUFLEET_OIDC_USERNAME_CLAIM)
        if not isinstance(username, str) or not username.strip():
            raise LoginRefused(f"the provider sent no {settings.GPUFLEET_OIDC_USERNAME_CLAIM} claim to name the user by")
        subject = f"{payload['iss']} {payload['sub']}"
        user = sign_in(
            self.request, source=Identity.Source.OIDC, subject=subject, username=username.strip(),
            email=_text(claims.get("email")), first_name=_text(claims.get("given_name")),
            last_name=_text(claims.get("family_name")), groups=_groups(claims, settings.GPUFLEET_OIDC_GROUPS_CLAIM),
        )
        if user is not None:
            Identity.objects.filter(source=Identity.Source.OIDC, subject=subject).update(refresh_token=self.refresh_token)
        return user


def groups_of(identity: Identity) -> list[str]:
    """The groups the provider gives this person now: their refresh token exchanged for an
    access token, and the provider's user info read with it (recheck.ASK)."""
    if not configured():
        raise Unavailable("OpenID Connect login is not set up (GPUFLEET_OIDC_ISSUER)")
    issuer, _, sub = identity.subject.rpartition(" ")
    if issuer != settings.GPUFLEET_OIDC_ISSUER:
        raise Unavailable(f"the person logged in at {issuer}, not at GPUFLEET_OIDC_ISSUER")
    if not identity.refresh_token:
        raise Unavailable("the provider gave no refresh token at the person's last login")
    backend = OIDCBackend()
    try:
        answer = backend.get_token({"client_id": settings.GPUFLEET_OIDC_CLIENT_ID,
                                    "client_secret": settings.GPUFLEET_OIDC_CLIENT_SECRET,
                                    "grant_type": "refresh_token", "refresh_token": identity.refresh_token})
        claims = backend.get_userinfo(answer["access_token"], None, None)
    except LoginRefused as refusal:
        raise Gone(str(refusal)) from None
    except (ProviderUnavailable, requests.RequestException, KeyError, TypeError, ValueError) as error:
        raise Unavailable(f"the provider did not answer ({error.__class__.__name__})") from None
    # The provider may rotate the refresh token: the old one is spent.
    Identity.objects.filter(pk=identity.pk).update(refresh_token=backend.refresh_token or identity.refresh_token)
    if not isinstance(claims, dict) or claims.get("sub") != sub:
        raise Gone("the provider's user info is not about the person who logged in")
    return _groups(claims, settings.GPUFLEET_OIDC_GROUPS_CLAIM)


def _token_error(response) -> str:
    """The error (and its description) of a token endpoint's refusal, in a line."""
    try:
        body = response.json()
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    words = [str(body.get(key) or "").strip() for key in ("error", "error_description")]
    said = ": ".join(word for word in words if word) or f"HTTP {response.status_code}"
    return " ".join(said.split())[:200]


def _unverified(token: str) -> dict:
    return jwt.decode(token, options={"verify_signature": False})


def _text(value) -> str:
    return value.strip() if isinstance(value, str) else ""


def _groups(claims: dict, name: str) -> list[str]:
    """The groups claim: a list of names, or one name. A dotted name that is not a claim
    of its own reaches into objects (realm_access.roles, Keycloak's realm roles)."""
    value = claims.get(name)
    if value is None and "." in name:
        value = claims
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [group for group in value if isinstance(group, str)]
    return []


def provider_logout_url(request) -> str:
    """Where logout sends a person (the library's OIDC_OP_LOGOUT_URL_METHOD): to the
    provider's end_session_endpoint if they logged in there and it has one, so their
    session there ends too, then back to our login page; else straight to the login page."""
    after = resolve_url(settings.LOGOUT_REDIRECT_URL)
    if request.session.get(BACKEND_SESSION_KEY) != OIDC_BACKEND or not configured():
        return after
    try:
        end_session = discovery().get("end_session_endpoint")
    except ProviderUnavailable:
        return after  # logging out here never waits for the provider
    if not end_session:
        return after
    params = {"client_id": settings.GPUFLEET_OIDC_CLIENT_ID, "post_logout_redirect_uri": request.build_absolute_uri(after)}
    if request.session.get("oidc_id_token"):
        params["id_token_hint"] = request.session["oidc_id_token"]
    return f"{end_session}{'&' if '?' in end_session else '?'}{urlencode(params)}"


def _failed(request, reason: str, status: int):
    return render(request, "registration/oidc_failed.html", {
        "provider": settings.GPUFLEET_OIDC_PROVIDER_NAME, "reason": reason, "unavailable": status == 503,
    }, status=status)


def _refused(request, reason: str):
    """Refused by us, not by the groups: audited, and the page says why."""
    log.warning("OpenID Connect login refused: %s", reason)
    record(None, Action.SSO_REFUSED, after={"source": "oidc", "reason": reason})
    return _failed(request, reason, 403)


class LoginView(OIDCAuthenticationRequestView):
    """The button: sends the person to the provider with a new state, nonce and PKCE
    challenge (kept in their session), or says the provider cannot be reached."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request):
        if not configured():
            raise Http404("OpenID Connect login is not set up")
        try:
            discovery()
        except ProviderUnavailable as error:
            return _failed(request, str(error), 503)
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """Where the provider sends the person back: the library checks the state, exchanges
    the code (with the PKCE verifier) and asks the backend to log them in."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request):
        if not configured():
            raise Http404("OpenID Connect login is not set up")
        try:
            return super().get(request)
        except LoginRefused as refusal:
            return _refused(request, str(refusal))
        except SuspiciousOperation:
            # The library's one other refusal here: a state this session never sent.
            return _refused(request, "the answer's state does not match a login started in this browser")
        except (ProviderUnavailable, requests.RequestException) as error:
            log.warning("OpenID Connect login failed at the provider: %s", error)
            return _failed(request, f"the provider did not complete the login ({error.__class__.__name__})", 503)

    def login_failure(self):
        if REFUSAL_KEY in self.request.session:  # the groups gave no role: the core said why
            return redirect("sso:no-access")
        if self.request.GET.get("error"):
            said = self.request.GET.get("error_description") or self.request.GET["error"]
            return _refused(self.request, f"the provider refused the login: {said[:200]}")
        if "oidc_states" not in self.request.session or "state" not in self.request.GET:
            return _refused(self.request, "the answer's state does not match a login started in this browser")
        return _refused(self.request, "this site did not accept the login")


@method_decorator(never_cache, name="dispatch")
class LogoutView(OIDCLogoutView):
    """The site's logout (POST), for every user: the session here ends, and a person who
    came through the provider is sent there to end theirs (provider_logout_url)."""

    get_settings = staticmethod(oidc_setting)
