"""The claims job of the central beat: deleting ended claims, when asked to. A claim
holds its GPUs only within its window, so nothing here starts or ends one."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.events import services as events

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.claims.tasks.release_expired", ignore_result=True)
def release_expired() -> list[str]:
    """With GPUFLEET_RELEASE_EXPIRED, delete the ended claims (audited, by "system");
    otherwise they are only flagged on the pages and left for their owners. Either
    way each ended claim still listed is an open event until it goes."""
    events.record_ended_claims(Claim.objects.ended().values_list("node_id", "name", "ends_at"))
    if not settings.GPUFLEET_RELEASE_EXPIRED:
        return []
    released = services.release_expired()
    if released:
        log.info("released %d ended claim(s): %s", len(released), ", ".join(released))
    return released
