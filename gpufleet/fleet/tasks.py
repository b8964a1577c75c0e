"""The fleet jobs of the central beat: offline marking and history pruning."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from gpufleet.fleet.models import DeviceSample, Node

log = logging.getLogger(__name__)


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


