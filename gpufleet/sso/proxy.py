"""Logins an authenticating proxy (oauth2-proxy, Authelia, ...) made: it sends the user's
name, and optionally groups and email, in headers. They are believed only from a peer in
GPUFLEET_TRUSTED_PROXIES; from anyone else they are headers a client wrote, and ignored."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import logout
from django.contrib.auth.backends import RemoteUserBackend
from django.contrib.auth.middleware import RemoteUserMiddleware
from django.core.exceptions import MiddlewareNotUsed

from gpufleet.core.security import address_in
from gpufleet.sso.backends import ActiveOnly
from gpufleet.sso.models import Identity
from gpufleet.sso.services import REFUSAL_KEY, clean_groups, follow, no_group, sign_in

# The groups header of the request before, so an unchanged one costs no query.
GROUPS_KEY = "sso_proxy_groups"


def meta_key(header: str) -> str:
    """Where Django's request.META holds an HTTP header: X-Forwarded-User -> HTTP_X_FORWARDED_USER."""
    return "HTTP_" + header.strip().upper().replace("-", "_")


class TrustedProxyMiddleware(RemoteUserMiddleware):
    """Django's RemoteUserMiddleware on GPUFLEET_REMOTE_USER_HEADER, for requests from a
    trusted proxy only. A person refused once in a session is not asked again (nor audited
    again) on each request, until the no-access page's "try again"."""

    def __init__(self, get_response):
        if not settings.GPUFLEET_REMOTE_USER_HEADER:
            raise MiddlewareNotUsed
        self.header = meta_key(settings.GPUFLEET_REMOTE_USER_HEADER)
        super().__init__(get_response)

    def __call__(self, request):
        if not address_in(request.META.get("REMOTE_ADDR", ""), settings.GPUFLEET_TRUSTED_PROXIES):
            return self.get_response(request)
        refused = request.session.get(REFUSAL_KEY) or {}
        if refused and refused.get("username") == request.META.get(self.header):
            return self.get_response(request)
        self.process_request(request)
        _follow_groups(request, request.META.get(self.header))
        return self.get_response(request)


def _follow_groups(request, remote_user: str | None) -> None:
    """The proxy is the directory here, and it sends the groups with every request: when they
    are not those of the person's last login, they count at once (services.follow)."""
    if not remote_user or not request.user.is_authenticated or request.user.get_username() != remote_user:
        return
    groups = clean_groups(_groups(request))
    if request.session.get(GROUPS_KEY) == groups:
        return
    identity = Identity.objects.filter(source=Identity.Source.PROXY, subject=remote_user, user=request.user).first()
    if identity is not None and identity.groups != groups and not follow(identity, groups):
        logout(request)
        request.session[REFUSAL_KEY] = {"username": remote_user, "reason": no_group(remote_user)}
        return
    request.session[GROUPS_KEY] = groups


def _groups(request) -> list[str]:
    header = settings.GPUFLEET_REMOTE_GROUPS_HEADER
    return request.META.get(meta_key(header), "").split(",") if header else []


class ProxyBackend(ActiveOnly, RemoteUserBackend):
    def authenticate(self, request, remote_user):
        if not remote_user or request is None:
            return None
        email_header = settings.GPUFLEET_REMOTE_EMAIL_HEADER
        email = request.META.get(meta_key(email_header), "") if email_header else ""
        return sign_in(request, source=Identity.Source.PROXY, subject=remote_user, username=remote_user,
                       email=email.strip(), groups=[group.strip() for group in _groups(request)])
