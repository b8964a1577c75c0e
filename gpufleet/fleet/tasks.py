"""Central tasks: ingest snapshots from agents, and the fleet jobs of the central beat."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from gpufleet.fleet.ingest import ingest_snapshot
from gpufleet.fleet.models import DeviceSample, Node

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.fleet.tasks.ingest", ignore_result=True)
def ingest(snapshot: dict, job_id: int | None = None) -> str:
    """Store a snapshot; when it answers a "diagnose now" job, finish that job."""
    from gpufleet.jobs.services import finish_diagnosis

    result = ingest_snapshot(snapshot)
    if job_id is not None:
        finish_diagnosis(job_id, result)
    return result.outcome


@shared_task(name="gpufleet.fleet.tasks.mark_offline", ignore_result=True)
def mark_offline() -> int:
    """Nodes that missed GPUFLEET_OFFLINE_AFTER_INTERVALS collections go offline."""
    count = Node.objects.stale().update(offline=True)
    if count:
        log.info("marked %d node(s) offline", count)
    return count


@shared_task(name="gpufleet.fleet.tasks.prune_history", ignore_result=True)
def prune_history() -> int:
    cutoff = timezone.now() - timedelta(hours=settings.GPUFLEET_HISTORY_RETENTION_HOURS)
    deleted, _ = DeviceSample.objects.filter(collected_at__lt=cutoff).delete()
    return deleted


