"""Central tasks for agent jobs."""

from celery import shared_task

from gpufleet.jobs import services


@shared_task(name="gpufleet.jobs.tasks.expire_jobs", ignore_result=True)
def expire_jobs() -> int:
    return services.expire_jobs()
