"""The password login of local accounts, and what every login backend of the site shares."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.backends import ModelBackend


class ActiveOnly:
    """A session's user is loaded only while active: a user single sign-on deactivated
    (or an admin did) is logged out at their next request, whichever backend logged them in."""

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active else None


class LocalBackend(ActiveOnly, ModelBackend):
    """Django's own passwords. With GPUFLEET_LOCAL_LOGIN=false only a superuser that single
    sign-on never touched (the break-glass account `manage.py createsuperuser` makes) may
    use one, for when the directory is down."""

    def user_can_authenticate(self, user) -> bool:
        if not super().user_can_authenticate(user):
            return False
        return settings.GPUFLEET_LOCAL_LOGIN or (user.is_superuser and not user.identities.exists())


def unthrottled(request, credentials=None) -> bool:
    """AXES_WHITELIST_CALLABLE: the login throttle counts password guesses. An authenticating
    proxy's header (believed from a trusted proxy only) and the OpenID provider's answer at
    the callback are none; counted, their refusals would fall under no user name, so the
    people refused at one address (the proxy's) would lock out everyone's there."""
    if credentials and "remote_user" in credentials:
        return True
    match = getattr(request, "resolver_match", None)
    return match is not None and match.view_name == "oidc:callback"
