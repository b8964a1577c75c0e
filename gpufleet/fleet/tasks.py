"""The fleet jobs of the central beat: offline marking, and the history's
housekeeping (roll-ups and retention, gpufleet/fleet/history.py)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db.models import F

from gpufleet.events import services as events
from gpufleet.fleet import history, ingest_health
from gpufleet.fleet.models import KEY_REFUSALS, NO_VALID_KEY, Node

log = logging.getLogger(__name__)


@shared_task(name="gpufleet.fleet.tasks.mark_offline", ignore_result=True)
def mark_offline() -> int:
    """Nodes that missed GPUFLEET_OFFLINE_AFTER_INTERVALS collections go offline; those
    whose messages since were refused for an old key say so (Node.lacks_valid_key). The
    site itself hearing nothing at all is an event of its own (ingest_health)."""
    stale = Node.objects.stale()
    count = stale.filter(refused_last_at__gt=F("last_seen"), refused_last_reason__in=KEY_REFUSALS).update(
        offline=True, problem=f"{NO_VALID_KEY}: what came in its name since its last report was refused "
                              "for an old key; give its agent the key `manage.py enroll` prints.")
    count += stale.update(offline=True)
    if count:
        log.info("marked %d node(s) offline", count)
    events.record_offline(Node.objects.filter(offline=True).values_list("pk", "last_seen"))
    silence = ingest_health.ingest_silence()
    events.record_ingest_silent(silence.reason if silence else None)
    return count


@shared_task(name="gpufleet.fleet.tasks.roll_history", ignore_result=True)
def roll_history() -> dict[str, int]:
    """Every five minutes: partitions made ahead (PostgreSQL), then the finished
    buckets rolled up. Returns the rollup rows written per series."""
    made = history.prepare_partitions()
    if made:
        log.info("made history partitions %s", ", ".join(made))
    return history.roll()


@shared_task(name="gpufleet.fleet.tasks.prune_history", ignore_result=True)
def prune_history() -> dict[str, int]:
    """Every hour: what each series keeps no longer goes. Returns the rows deleted
    per series (partitions dropped on PostgreSQL are logged, not counted in rows)."""
    pruned = history.prune()
    for each in pruned:
        if each.partitions:
            log.info("dropped %s history partitions %s", each.series, ", ".join(each.partitions))
    return {each.series: each.rows for each in pruned}
