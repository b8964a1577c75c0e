"""Asking the directory again about people who signed in through it, so that one taken out
of the groups (or out of the directory) loses access without logging in again, which someone
who left never does. Asked at most every GPUFLEET_SSO_RECHECK_S per person: when they open a
page (`RecheckMiddleware`), when their API token is used (gpufleet/api/models.py), and from
the central beat for those not seen (gpufleet/sso/tasks.py). An authenticating proxy cannot
be asked: its groups header counts at every request instead (gpufleet/sso/proxy.py)."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import logout
from django.contrib.auth.signals import user_logged_in
from django.db.models import QuerySet
from django.dispatch import receiver
from django.utils import timezone
from django.utils.module_loading import import_string

from gpufleet.sso import services
from gpufleet.sso.models import Identity

log = logging.getLogger(__name__)

# How each way in is asked: a function of the identity giving its groups now, or raising
# Unavailable (asked again at the next interval) or Gone (no access).
ASK = {
    Identity.Source.LDAP: "gpufleet.sso.ldap.groups_of",
    Identity.Source.OIDC: "gpufleet.sso.oidc.groups_of",
}
# The most people one beat asks about, oldest first; the next beat goes on.
BATCH = 500
# When this session's person is next due to be asked (a Unix time), so a page costs no query.
DUE_KEY = "sso_recheck_due"


class Unavailable(Exception):
    """The directory could not be asked now: access stays as it was until the next interval."""


class Gone(Exception):
    """The directory no longer vouches for this person (the message says how)."""


def due(user=None) -> QuerySet[Identity]:
    """The identities the directory is due to be asked about: of `user` (a user or an
    OuterRef) or of everyone."""
    cutoff = timezone.now() - timedelta(seconds=settings.GPUFLEET_SSO_RECHECK_S)
    identities = Identity.objects.filter(source__in=list(ASK), seen_at__lte=cutoff, refused=False,
                                         user__is_active=True)
    return identities if user is None else identities.filter(user=user)


def still_allowed(user) -> bool:
    """False once the directory, asked again where due, gives `user` no role here."""
    return user.is_active and all(ask(identity) for identity in due(user).select_related("user"))


def ask(identity: Identity) -> bool:
    """Ask the directory about this identity and follow its answer; True while they keep access."""
    # Claimed with a conditional update: two requests (or a request and the beat) ask once.
    if not Identity.objects.filter(pk=identity.pk, seen_at=identity.seen_at).update(seen_at=timezone.now()):
        return True
    try:
        groups = import_string(ASK[identity.source])(identity)
    except Unavailable as error:
        log.warning("Could not ask the directory again about %s (%s): %s", identity.user, identity, error)
        return True
    except Gone as gone:
        return services.follow(identity, None, gone=str(gone))
    return services.follow(identity, groups)


class RecheckMiddleware:
    """A signed-in person whose directory no longer gives them a role is logged out at their
    next page once the interval is over."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.user.is_authenticated:
            due_at = request.session.get(DUE_KEY)
            now = time.time()
            if due_at is None or now >= due_at:
                if still_allowed(request.user):
                    request.session[DUE_KEY] = now + settings.GPUFLEET_SSO_RECHECK_S
                else:
                    logout(request)
        return self.get_response(request)


@receiver(user_logged_in)
def _asked_at_login(sender, request, user, **kwargs) -> None:
    # A login has just asked the directory (or was a local one): the next ask is an interval away.
    if request is not None and hasattr(request, "session"):
        request.session[DUE_KEY] = time.time() + settings.GPUFLEET_SSO_RECHECK_S
