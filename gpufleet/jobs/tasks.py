"""Central tasks for agent jobs."""

from celery import shared_task

from gpufleet.jobs import services
from gpufleet.wire import JOB_PROGRESS_TASK


@shared_task(name=JOB_PROGRESS_TASK, ignore_result=True)
def job_progress(job_id: int, status: str, output: str = "", error: str = "") -> bool:
    return services.report_progress(job_id, status, output, error)


@shared_task(name="gpufleet.jobs.tasks.expire_jobs", ignore_result=True)
def expire_jobs() -> int:
    return services.expire_jobs()
