"""Asking a node's agent for work, and recording what it reports back."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpufleet.audit.models import record
from gpufleet.fleet import credentials
from gpufleet.jobs.models import OPEN_STATUSES, Job, JobKind, JobStatus
from gpufleet.wire import APPLY_FIX_TASK, COLLECT_TASK


class FixNotAllowed(Exception):
    pass


def _send_on_commit(task: str, args: list, node) -> None:
    """Send `task` to the node's agent, signed for it: agents run only what the centre signed."""
    from gpufleet.celery import app

    auth = credentials.sign_for_agent(node.name, task, args)
    # After commit, so the agent's reply can never arrive before the job row exists.
    transaction.on_commit(
        lambda: app.send_task(task, args=args, kwargs={"auth": auth}, queue=node.agent_queue,
                              expires=settings.GPUFLEET_JOB_TIMEOUT)
    )


def request_diagnosis(node, user) -> Job:
    """Queue "diagnose now" on the node's agent. A job already open is reused, so
    impatient clicks do not pile up work on the node."""
    with transaction.atomic():
        job = Job.objects.filter(node=node, kind=JobKind.DIAGNOSE, status__in=OPEN_STATUSES).first()
        if job is not None:
            return job
        job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE, requested_by=user)
        record(user, "node.diagnose", node=node, target=node.name, after={"job": job.pk})
        _send_on_commit(COLLECT_TASK, [job.pk], node)
    return job


def request_fix(node, code: str, user) -> Job:
    """Queue a fix on the node's agent; only for codes the node says it allows."""
    if code not in node.fixes_allowed:
        raise FixNotAllowed(f"{node.name} does not allow remote fixes for {code!r}")
    with transaction.atomic():
        job = Job.objects.create(node=node, kind=JobKind.FIX, fix_code=code, requested_by=user)
        record(user, "node.fix", node=node, target=code, after={"job": job.pk, "fix": code})
        _send_on_commit(APPLY_FIX_TASK, [job.pk, code], node)
    return job


def report_progress(job_id: int, status: str, output: str = "", error: str = "", node: str | None = None) -> bool:
    """Move an open job on as the agent reports; a finished job is never reopened
    (duplicate or late messages are harmless). With `node` (who signed the report),
    only a job of that node moves: a node reports on its own jobs only."""
    now = timezone.now()
    status = JobStatus(status)
    fields = {"status": status, "output": output[-20000:], "error": error[-4000:]}
    if status == JobStatus.RUNNING:
        fields = {"status": status, "started_at": now}
    elif status.finished:
        fields["finished_at"] = now
    jobs = Job.objects.filter(pk=job_id, status__in=OPEN_STATUSES)
    if node is not None:
        jobs = jobs.filter(node__name=node)
    return bool(jobs.update(**fields))


def expire_jobs(now=None) -> int:
    """Jobs the node did not answer in time are closed as expired."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUFLEET_JOB_TIMEOUT)
    return Job.objects.filter(status__in=OPEN_STATUSES, created_at__lt=cutoff).update(
        status=JobStatus.EXPIRED, finished_at=now, error="the node did not answer in time"
    )
