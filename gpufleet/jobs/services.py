"""Asking a node's agent for work, and recording what it reports back."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from kombu.exceptions import OperationalError

from gpufleet.audit.models import Action, record
from gpufleet.events import services as events
from gpufleet.fleet import credentials, diagnostics
from gpufleet.gpu import dcgm
from gpufleet.jobs.models import OPEN_STATUSES, Job, JobKind, JobStatus
from gpufleet.wire import APPLY_FIX_TASK, COLLECT_TASK, DCGM_DIAG_TASK, clean_text, node_key_prefix

log = logging.getLogger(__name__)


class FixNotAllowed(Exception):
    pass


class DiagnosticUnavailable(Exception):
    """A DCGM diagnostic that cannot be asked of this node (no DCGM, or a level not offered)."""


BROKER_UNREACHABLE = "the broker is unreachable: nothing was sent"
# One reconnect (a pooled connection the broker dropped), not kombu's three: the person
# who clicked waits for the answer, up to the connection timeout per try.
_PUBLISH_RETRY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}


def _send_on_commit(task: str, args: list, job: Job, user, action: str, target: str) -> None:
    """Send `task` to the node's agent, signed for it: agents run only what the centre signed.
    Should the broker refuse it, the job is closed as failed at once (and `job` says so)."""
    from gpufleet.celery import app

    node = job.node
    auth = credentials.sign_for_agent(node.name, task, args)

    def send() -> None:
        # Under the node's own key prefix, where its agent (whose broker user may use no
        # other keys) consumes its queue.
        options = {"global_keyprefix": node_key_prefix(node.name)}
        try:
            with app.connection_for_write(transport_options=options) as connection:
                app.send_task(task, args=args, kwargs={"auth": auth}, queue=node.agent_queue, connection=connection,
                              expires=settings.GPUFLEET_JOB_TIMEOUT, retry_policy=_PUBLISH_RETRY)
        except OperationalError as exc:
            log.error("%s for job %s was not sent: %s", task, job.pk, exc)
            _fail_unsent(job, user, action, target)

    # After commit, so the agent's reply can never arrive before the job row exists.
    transaction.on_commit(send)


def _fail_unsent(job: Job, user, action: str, target: str) -> None:
    """Close a job nothing was sent for: no agent will ever answer it."""
    now = timezone.now()
    with transaction.atomic():
        if Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).update(
            status=JobStatus.FAILED, error=BROKER_UNREACHABLE, finished_at=now
        ):
            record(user, action, node=job.node, target=target, before={"job": job.pk, "status": "queued"},
                   after={"job": job.pk, "status": "failed", "error": BROKER_UNREACHABLE})
    job.refresh_from_db(fields=["status", "error", "finished_at"])


def request_diagnosis(node, user) -> Job:
    """Queue "diagnose now" on the node's agent. A job already open is reused, so
    impatient clicks do not pile up work on the node."""
    with transaction.atomic():
        job = Job.objects.filter(node=node, kind=JobKind.DIAGNOSE, status__in=OPEN_STATUSES).first()
        if job is not None:
            return job
        job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE, requested_by=user)
        record(user, "node.diagnose", node=node, target=node.name, after={"job": job.pk})
        _send_on_commit(COLLECT_TASK, [job.pk], job, user, "node.diagnose", node.name)
    return job


def request_fix(node, code: str, user) -> Job:
    """Queue a fix on the node's agent; only for codes the node says it allows."""
    if code not in node.fixes_allowed:
        raise FixNotAllowed(f"{node.name} does not allow remote fixes for {code!r}")
    with transaction.atomic():
        job = Job.objects.create(node=node, kind=JobKind.FIX, fix_code=code, requested_by=user)
        record(user, "node.fix", node=node, target=code, after={"job": job.pk, "fix": code})
        _send_on_commit(APPLY_FIX_TASK, [job.pk, code], job, user, "node.fix", code)
    return job


def request_dcgm_diag(node, level: int, user) -> Job:
    """Queue DCGM's diagnostic of `level` (`dcgmi diag -r 1` or `-r 2`) on the node's agent,
    for a node whose agent found DCGM. A diagnostic already open on the node is reused:
    two at once would only make the second fail (DCGM runs one at a time)."""
    if level not in dcgm.LEVELS:
        raise DiagnosticUnavailable(f"level {level} is not offered; only {', '.join(map(str, dcgm.LEVELS))}")
    info = dcgm.DcgmInfo.from_dict(node.dcgm)
    if info is None or not info.installed:
        why = info.problem if info is not None else "its agent has not said (an agent older than DCGM detection)"
        raise DiagnosticUnavailable(f"{node.name} has no DCGM: {why}")
    with transaction.atomic():
        job = Job.objects.filter(node=node, kind=JobKind.DCGM_DIAG, status__in=OPEN_STATUSES).first()
        if job is not None:
            return job
        job = Job.objects.create(node=node, kind=JobKind.DCGM_DIAG, level=level, requested_by=user)
        target = f"dcgmi diag -r {level}"
        record(user, Action.NODE_DCGM_DIAG, node=node, target=target, after={"job": job.pk, "level": level})
        _send_on_commit(DCGM_DIAG_TASK, [job.pk, level], job, user, Action.NODE_DCGM_DIAG, target)
    return job


# The most of a diagnostic's output read for its result: far above what eight GPUs print.
DIAG_OUTPUT_MAX = 2 * 2**20


def report_progress(job_id: int, status: str, output: str = "", error: str = "", node: str | None = None) -> bool:
    """Move an open job on as the agent reports; a finished job is never reopened
    (duplicate or late messages are harmless). With `node` (who signed the report),
    only a job of that node moves: a node reports on its own jobs only. Texts are
    cleaned as the agent cleans them, for agents that did not: a NUL would lose the report."""
    now = timezone.now()
    status = JobStatus(status)
    fields = {"status": status, "output": clean_text(output[-20000:]), "error": clean_text(error[-4000:])}
    if status == JobStatus.RUNNING:
        fields = {"status": status, "started_at": now}
    elif status.finished:
        fields["finished_at"] = now
    jobs = Job.objects.filter(pk=job_id, status__in=OPEN_STATUSES)
    if node is not None:
        jobs = jobs.filter(node__name=node)
    # One transaction: a job never reads done without its result, and a report that fails
    # half-way leaves the job open for the same report again.
    with transaction.atomic():
        moved = bool(jobs.update(**fields))
        if moved and status.finished:
            _finish_dcgm_diag(job_id, output, now)
            events.record_fix(job_id, now)
    return moved


def _finish_dcgm_diag(job_id: int, output: str, now) -> None:
    """A finished DCGM diagnostic: its result read from what dcgmi printed (the whole
    output, not the stored tail), kept on the job, made the node's when it has results,
    and an event of the node's timeline."""
    job = Job.objects.filter(pk=job_id, kind=JobKind.DCGM_DIAG).values("node_id", "level", "error").first()
    if job is None:
        return
    result = dcgm.parse_diag(clean_text(output[:DIAG_OUTPUT_MAX]), job["level"])
    if not result.tests and job["error"]:
        result = dcgm.DiagResult(error=job["error"][:dcgm.MESSAGE_MAX], form=result.form, level=job["level"])
    Job.objects.filter(pk=job_id).update(result=result.to_dict())
    diagnostics.record_run(job["node_id"], job_id, result, now)
    events.record_diagnostic(job_id, job["node_id"], job["level"], str(result.verdict), result.summary(), now)


def expire_jobs(now=None) -> int:
    """Jobs the node did not answer in time are closed as expired: one still queued after
    the job timeout (its agent refuses it by then), a running DCGM diagnostic only after
    the job timeout and the longest a diagnostic may run, and a collect interval more for
    its report to arrive."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.GPUFLEET_JOB_TIMEOUT)
    long_cutoff = cutoff - timedelta(seconds=settings.GPUFLEET_DCGM_DIAG_TIMEOUT + settings.GPUFLEET_COLLECT_INTERVAL)
    running_diagnostic = Q(status=JobStatus.RUNNING, kind=JobKind.DCGM_DIAG)
    due = (~running_diagnostic & Q(created_at__lt=cutoff)) | (running_diagnostic & Q(created_at__lt=long_cutoff))
    return Job.objects.filter(due, status__in=OPEN_STATUSES).update(
        status=JobStatus.EXPIRED, finished_at=now, error="the node did not answer in time"
    )
