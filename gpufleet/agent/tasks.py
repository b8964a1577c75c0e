"""Tasks that run on a node's agent, consumed from its own queue node.<name>.

What the agent sends is signed with its key (GPUFLEET_AGENT_KEY); what it is asked
to do for a job (diagnose now, apply a fix, run a DCGM diagnostic) runs only when the centre signed it for
this node, recently, and a fix only once per job and only for a code this node's
GPUFLEET_AGENT_FIXES allows. The agent's own schedule (collect without a job) needs
no signature: it asks for nothing but the report the agent sends anyway."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from celery.signals import worker_ready

from gpufleet import wire
from gpufleet.agent import diagnostics, jobs_run
from gpufleet.agent.fixes import apply_fix as run_fix
from gpufleet.agent.host import snapshot_this_host
from gpufleet.core import agent_settings, broker
from gpufleet.gpu import dcgm

log = logging.getLogger(__name__)


def agent_key() -> wire.NodeKey | None:
    """This agent's key, or None (logged: at every message, as it needs fixing) when it
    has none or an unreadable one."""
    settings = agent_settings.current()
    if not settings.GPUFLEET_AGENT_KEY:
        log.error("not enrolled (GPUFLEET_AGENT_KEY is not set), so the central site refuses what this agent sends:"
                  " run `manage.py enroll %s` there and set the line it prints.", settings.GPUFLEET_NODE_NAME)
        return None
    try:
        return wire.NodeKey.parse(settings.GPUFLEET_AGENT_KEY)
    except ValueError as exc:
        log.error("GPUFLEET_AGENT_KEY is %s", exc)
        return None


def send_to_centre(kind: str, payload: list) -> None:
    """Append `payload` (wire.encode_entry: a snapshot or job progress) to the central
    ingest stream, signed as this node, through the stream's append function
    (gpufleet/core/broker.py), which trims the stream to the centre's bound: only a
    backlog that long is ever cut, and the centre counts what was."""
    key = agent_key()
    if key is None:
        return  # the centre would refuse it; agent_key said why
    broker.append(wire.encode_entry(key, agent_settings.current().GPUFLEET_NODE_NAME, kind, payload))


def from_centre(task: str, args: list, auth) -> bool:
    """Whether the centre signed this task for this node within the job timeout (logged if not)."""
    key = agent_key()
    settings = agent_settings.current()
    node = settings.GPUFLEET_NODE_NAME

    def key_for(name: str, generation: int) -> wire.NodeKey | None:
        return key if key is not None and name == node and generation == key.generation else None

    try:
        wire.verify(auth, wire.TO_AGENT, task, args, key_for, max_age=settings.GPUFLEET_JOB_TIMEOUT)
    except wire.SignatureError as exc:
        log.warning("refused %s %s: %s", task, repr(args)[:200], exc)
        return False
    return True


@shared_task(bind=True, name=wire.COLLECT_TASK, ignore_result=True)
def collect(self, job_id: int | None = None, auth: dict | None = None) -> None:
    """Diagnose this host and send the snapshot to the central ingest stream."""
    if job_id is not None:
        if not from_centre(wire.COLLECT_TASK, [job_id], auth):
            return
        send_to_centre(wire.PROGRESS, [job_id, "running", "", ""])
    send_to_centre(wire.SNAPSHOT, [wire.encode_snapshot(snapshot_this_host()), job_id])


@shared_task(bind=True, name=wire.APPLY_FIX_TASK, ignore_result=True)
def apply_fix(self, job_id: int, code: str, auth: dict | None = None) -> None:
    """Run the fixed command for `code`, report its output, then diagnose again."""
    if not from_centre(wire.APPLY_FIX_TASK, [job_id, code], auth):
        return
    # A replayed signed request is not run twice, even by a restarted agent.
    ran, now = jobs_run.for_this_agent(), time.time()
    if ran.ran(job_id, now):
        log.warning("refused fix %s for job %s: this job's fix already ran here", code, job_id)
        return
    ran.record(job_id, now, jobs_run.signed_at(auth))
    send_to_centre(wire.PROGRESS, [job_id, "running", "", ""])
    result = run_fix(code)
    log.info("fix %s for job %s: %s", code, job_id, "ok" if result.ok else result.error)
    status = "done" if result.ok else "failed"
    send_to_centre(wire.PROGRESS, [job_id, status, result.output, result.error])
    send_to_centre(wire.SNAPSHOT, [wire.encode_snapshot(snapshot_this_host()), None])


@shared_task(bind=True, name=wire.DCGM_DIAG_TASK, ignore_result=True)
def run_dcgm_diag(self, job_id: int, level: int, auth: dict | None = None) -> None:
    """Run DCGM's diagnostic of `level` (`dcgmi diag -r 1` or `-r 2`), report what it
    printed (the site reads the result from it), then diagnose again."""
    if not from_centre(wire.DCGM_DIAG_TASK, [job_id, level], auth):
        return
    if level not in dcgm.LEVELS:
        log.warning("refused DCGM diagnostic level %r for job %s: only %s are run", level, job_id, dcgm.LEVELS)
        return
    # Like a fix, a replayed request runs nothing: -r 2 loads every GPU for minutes.
    ran, now = jobs_run.for_this_agent(), time.time()
    if ran.ran(job_id, now):
        log.warning("refused DCGM diagnostic for job %s: it already ran here", job_id)
        return
    ran.record(job_id, now, jobs_run.signed_at(auth))
    send_to_centre(wire.PROGRESS, [job_id, "running", "", ""])

    def report() -> None:
        send_to_centre(wire.SNAPSHOT, [wire.encode_snapshot(snapshot_this_host()), None])

    result, printed = diagnostics.run(level, report)
    log.info("DCGM diagnostic -r %s for job %s: %s", level, job_id, result.verdict)
    if result.tests:
        send_to_centre(wire.PROGRESS, [job_id, "done", wire.clean_text(printed), ""])
    else:
        send_to_centre(wire.PROGRESS, [job_id, "failed", wire.clean_text(printed), wire.clean_text(result.error)])
    report()


@worker_ready.connect
def collect_at_start(sender, **kwargs) -> None:
    """An agent reports as soon as it starts, not one interval later. Central workers load
    these tasks too (to send them), but only the agent's app collects."""
    if sender.app.main == agent_settings.AGENT_APP:
        collect.apply_async(queue=wire.agent_queue(agent_settings.current().GPUFLEET_NODE_NAME))
