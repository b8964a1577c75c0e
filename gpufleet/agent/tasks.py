"""Tasks that run on a node's agent, consumed from its own queue node.<name>."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from gpufleet.agent.fixes import apply_fix as run_fix
from gpufleet.agent.host import snapshot_this_host

log = logging.getLogger(__name__)

INGEST = "gpufleet.fleet.tasks.ingest"
JOB_PROGRESS = "gpufleet.jobs.tasks.job_progress"


@shared_task(bind=True, name="gpufleet.agent.tasks.collect", ignore_result=True)
def collect(self, job_id: int | None = None) -> None:
    """Diagnose this host and send the snapshot to the central ingest queue."""
    if job_id is not None:
        self.app.send_task(JOB_PROGRESS, args=[job_id, "running"], queue="ingest")
    snapshot = snapshot_this_host()
    self.app.send_task(INGEST, args=[snapshot, job_id], queue="ingest")


@shared_task(bind=True, name="gpufleet.agent.tasks.apply_fix", ignore_result=True)
def apply_fix(self, job_id: int, code: str) -> None:
    """Run the fixed command for `code`, report its output, then diagnose again."""
    self.app.send_task(JOB_PROGRESS, args=[job_id, "running"], queue="ingest")
    result = run_fix(code)
    log.info("fix %s for job %s: %s", code, job_id, "ok" if result.ok else result.error)
    status = "done" if result.ok else "failed"
    self.app.send_task(JOB_PROGRESS, args=[job_id, status, result.output, result.error], queue="ingest")
    self.app.send_task(INGEST, args=[snapshot_this_host(), None], queue="ingest")


@worker_ready.connect
def collect_at_start(sender, **kwargs) -> None:
    """An agent reports as soon as it starts, not one interval later."""
    if settings.GPUFLEET_ROLE == "agent":
        collect.apply_async(queue=f"node.{settings.GPUFLEET_NODE_NAME}")
