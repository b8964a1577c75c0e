"""The ingest task: where agents' snapshots arrive on the central site."""

from __future__ import annotations

from celery import shared_task

from gpufleet import wire
from gpufleet.ingest.services import finish_diagnosis, ingest_snapshot


@shared_task(name=wire.INGEST_TASK, ignore_result=True)
def ingest(snapshot: dict, job_id: int | None = None) -> str:
    """Store a snapshot; when it answers a "diagnose now" job, finish that job."""
    result = ingest_snapshot(snapshot)
    if job_id is not None:
        finish_diagnosis(job_id, result)
    return result.outcome
