"""The ingest task: where agents' snapshots arrive on the central site.

Agents send one message per snapshot to wire.INGEST_TASK (args: snapshot, job_id).
The store takes batches (`ingest_snapshots`), but the worker still hands it one
message at a time: celery-batches, which would buffer them, supports only
celery < 5.7."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.db import InterfaceError, OperationalError, close_old_connections

from gpufleet import wire
from gpufleet.ingest.metrics import record_ingest
from gpufleet.ingest.services import finish_diagnosis, ingest_snapshots

log = logging.getLogger(__name__)

# Waits between tries when the database is unreachable (PostgreSQL restarting): about
# a minute in all, within CELERY_TASK_SOFT_TIME_LIMIT.
RETRY_DELAYS_S = (1, 2, 4, 8, 16, 30)


@shared_task(name=wire.INGEST_TASK, ignore_result=True)
def ingest(snapshot: dict, job_id: int | None = None) -> str:
    """Store a snapshot; when it answers a "diagnose now" job, finish that job."""
    started = time.monotonic()
    [result] = store_with_retries([snapshot])
    record_ingest(result.outcome, time.monotonic() - started)
    if job_id is not None:
        finish_diagnosis(job_id, result)
    return result.outcome


def store_with_retries(snapshots: list, delays=RETRY_DELAYS_S):
    """`ingest_snapshots`, tried again after each of `delays` while the database is
    unreachable; the last error is raised (the worker logs it; the message, acked
    late, stays in the broker only if the worker dies meanwhile)."""
    for delay in (*delays, None):
        try:
            return ingest_snapshots(snapshots)
        except (OperationalError, InterfaceError) as exc:
            if delay is None:
                raise
            log.warning("database unreachable while storing %d snapshots (%s); retrying in %s s",
                        len(snapshots), exc, delay)
            close_old_connections()  # a broken connection is replaced on the next try
            time.sleep(delay)
    raise AssertionError("unreachable")
