"""Central tasks for agent jobs."""

import logging

from celery import shared_task

from gpufleet.fleet import credentials
from gpufleet.jobs import services
from gpufleet.wire import JOB_PROGRESS_TASK, SignatureError

log = logging.getLogger(__name__)


@shared_task(name=JOB_PROGRESS_TASK, ignore_result=True)
def job_progress(job_id: int, status: str, output: str = "", error: str = "", auth: dict | None = None) -> bool:
    """A node's agent reports on one of its jobs; refused (logged) unless that node signed it."""
    try:
        node = credentials.sender(auth, JOB_PROGRESS_TASK, [job_id, status, output, error])
    except SignatureError as exc:
        log.warning("refused progress of job %s: %s", repr(job_id)[:40], exc)
        return False
    return services.report_progress(job_id, status, output, error, node=node)


@shared_task(name="gpufleet.jobs.tasks.expire_jobs", ignore_result=True)
def expire_jobs() -> int:
    return services.expire_jobs()
