"""The claims job of the central beat: releasing expired claims, when asked to."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.events import services as events

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.claims.tasks.release_expired", ignore_result=True)
def release_expired() -> list[str]:
    """With GPUFLEET_RELEASE_EXPIRED, delete the expired claims (audited, by "system");
    otherwise they are only flagged on the pages and left for their owners. Either
    way each expired claim still held is an open event until it goes."""
    events.record_expired_claims(
        Claim.objects.filter(expires_at__lte=timezone.now()).values_list("node_id", "name", "expires_at"))
    if not settings.GPUFLEET_RELEASE_EXPIRED:
        return []
    released = services.release_expired()
    if released:
        log.info("released %d expired claim(s): %s", len(released), ", ".join(released))
    return released
