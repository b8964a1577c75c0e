"""Who is calling the API, and may they? Two ways in, tried in this order:

- `Authorization: Bearer <token>`: a personal API token (gpufleet.api.models). No CSRF
  check: a browser never adds that header by itself, so it is not an ambient credential.
- the site's session cookie, for the pages' own calls and for scripts that log in like a
  browser. Writes keep Django's CSRF check, since a browser sends the cookie on its own.

Either way the caller needs `can(user, VIEW)` (gpufleet.core.access, like the pages), and a
read-scope token never writes. What a write may change is then the endpoint's to say, as on
the pages: claims by gpufleet.claims.rights, alerts and maintenance by their roles."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from gpufleet.api.errors import ApiError
from gpufleet.api.models import ApiToken
from gpufleet.core.access import VIEW, can

READS = ("GET", "HEAD")


class Refused(Exception):
    """Carries an answer already made (Django's CSRF failure view) out of an auth check."""

    def __init__(self, response: HttpResponse):
        super().__init__(response.status_code)
        self.response = response


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        found = ApiToken.find(token)
        if found is None:
            # Never fall back to the session: the caller meant this token.
            raise ApiError(401, "bad_token", "the API token is unknown or revoked")
        _authorize(request, found.user, may_write=found.can_write)
        found.touch()
        request.user = found.user
        return found.user


class SessionAuth(APIKeyCookie):
    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request: HttpRequest) -> str | None:
        # The CSRF check waits for `authenticate`: an anonymous caller is told to log in.
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: str | None):
        if not request.user.is_authenticated:
            return None
        refused = check_csrf(request)
        if refused is not None:
            raise Refused(refused)
        _authorize(request, request.user, may_write=True)
        # Like @ensure_csrf_cookie: any answer leaves the csrftoken cookie that a script
        # sends back as X-CSRFToken on its writes.
        get_token(request)
        return request.user


def _authorize(request: HttpRequest, user, may_write: bool) -> None:
    if not can(user, VIEW):
        raise ApiError(403, "forbidden", "your role may not view")
    if request.method not in READS and not may_write:
        raise ApiError(403, "forbidden", "this API token may only read")


def token_user(secret: str):
    """The active user this API token acts as, its use noted; None for an unknown or
    revoked token. What the exports accept (`requires(..., tokens=True)`)."""
    found = ApiToken.find(secret)
    if found is None:
        return None
    found.touch()
    return found.user
