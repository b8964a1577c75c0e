"""Logins an authenticating proxy (oauth2-proxy, Authelia, ...) made: it sends the user's
name, and optionally groups and email, in headers. They are believed only from a peer in
GPUFLEET_TRUSTED_PROXIES; from anyone else they are headers a client wrote, and ignored."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.backends import RemoteUserBackend
from django.contrib.auth.middleware import RemoteUserMiddleware
from django.core.exceptions import MiddlewareNotUsed

from gpufleet.core.security import address_in
from gpufleet.sso.backends import ActiveOnly
from gpufleet.sso.models import Identity
from gpufleet.sso.services import REFUSAL_KEY, sign_in


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
        return super().__call__(request)


class ProxyBackend(ActiveOnly, RemoteUserBackend):
    def authenticate(self, request, remote_user):
        if not remote_user or request is None:
            return None
        groups_header = settings.GPUFLEET_REMOTE_GROUPS_HEADER
        groups = request.META.get(meta_key(groups_header), "").split(",") if groups_header else []
        email_header = settings.GPUFLEET_REMOTE_EMAIL_HEADER
        email = request.META.get(meta_key(email_header), "") if email_header else ""
        return sign_in(request, source=Identity.Source.PROXY, subject=remote_user, username=remote_user,
                       email=email.strip(), groups=[group.strip() for group in groups])
