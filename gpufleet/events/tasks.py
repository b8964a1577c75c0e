"""The events jobs of the central beat, on the housekeeping queue (never ingest's):
closing what cleared while nothing observed it, and the retention."""

from __future__ import annotations

import logging

from celery import shared_task

from gpufleet.events import services

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.events.tasks.close_cleared", ignore_result=True)
def close_cleared() -> int:
    """Every collect interval: events clear for GPUFLEET_EVENT_CLOSE_AFTER_S close."""
    return services.close_cleared()


@shared_task(name="gpufleet.events.tasks.prune_events", ignore_result=True)
def prune_events() -> int:
    """Every hour: events closed more than GPUFLEET_EVENT_RETENTION_DAYS ago go."""
    deleted = services.prune()
    if deleted:
        log.info("deleted %d event(s) past their retention", deleted)
    return deleted
