"""Tasks that run on a node's agent, consumed from its own queue node.<name>."""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from gpufleet.agent.fixes import apply_fix as run_fix
from gpufleet.agent.host import snapshot_this_host
from gpufleet.wire import APPLY_FIX_TASK, COLLECT_TASK, INGEST_QUEUE, INGEST_TASK, JOB_PROGRESS_TASK, agent_queue

log = logging.getLogger(__name__)


@shared_task(bind=True, name=COLLECT_TASK, ignore_result=True)
def collect(self, job_id: int | None = None) -> None:
    """Diagnose this host and send the snapshot to the central ingest queue."""
    if job_id is not None:
        self.app.send_task(JOB_PROGRESS_TASK, args=[job_id, "running"], queue=INGEST_QUEUE)
    snapshot = snapshot_this_host()
    self.app.send_task(INGEST_TASK, args=[snapshot, job_id], queue=INGEST_QUEUE)


@shared_task(bind=True, name=APPLY_FIX_TASK, ignore_result=True)
def apply_fix(self, job_id: int, code: str) -> None:
    """Run the fixed command for `code`, report its output, then diagnose again."""
    self.app.send_task(JOB_PROGRESS_TASK, args=[job_id, "running"], queue=INGEST_QUEUE)
    result = run_fix(code)
    log.info("fix %s for job %s: %s", code, job_id, "ok" if result.ok else result.error)
    status = "done" if result.ok else "failed"
    self.app.send_task(JOB_PROGRESS_TASK, args=[job_id, status, result.output, result.error], queue=INGEST_QUEUE)
    self.app.send_task(INGEST_TASK, args=[snapshot_this_host(), None], queue=INGEST_QUEUE)


@worker_ready.connect
def collect_at_start(sender, **kwargs) -> None:
    """An agent reports as soon as it starts, not one interval later."""
    if settings.GPUFLEET_ROLE == "agent":
        collect.apply_async(queue=agent_queue(settings.GPUFLEET_NODE_NAME))
