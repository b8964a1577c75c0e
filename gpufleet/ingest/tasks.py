"""The ingest task: where agents' snapshots arrive on the central site.

Agents send one message per snapshot to wire.INGEST_TASK (args: snapshot, job_id;
kwargs: auth, the node's signature). Nothing is written before the signature is
checked and found to be that of the node the snapshot reports on. The store takes
batches (`ingest_snapshots`), but the worker still hands it one message at a time:
celery-batches, which would buffer them, supports only celery < 5.7."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.db import InterfaceError, OperationalError, close_old_connections

from gpufleet import wire
from gpufleet.fleet import credentials
from gpufleet.ingest.metrics import record_ingest
from gpufleet.ingest.services import REJECTED, finish_diagnosis, ingest_snapshots, show_rejection

log = logging.getLogger(__name__)

# Waits between tries when the database is unreachable (PostgreSQL restarting): about
# a minute in all, within CELERY_TASK_SOFT_TIME_LIMIT.
RETRY_DELAYS_S = (1, 2, 4, 8, 16, 30)
KEY_FIX = ("Give the node's agent its current key: on the central site run `manage.py enroll {name}` and put "
           "the GPUFLEET_AGENT_KEY line it prints into the agent's environment, then restart the agent.")


@shared_task(name=wire.INGEST_TASK, ignore_result=True)
def ingest(snapshot: dict, job_id: int | None = None, auth: dict | None = None) -> str:
    """Store a snapshot its node signed; when it answers a "diagnose now" job of that
    node, finish that job."""
    started = time.monotonic()
    args = [snapshot, job_id]
    try:
        signer = with_retries(lambda: credentials.sender(auth, wire.INGEST_TASK, args), "checking a signature")
        # One that names no node at all is malformed: the store rejects it with its reason.
        claimed = snapshot.get("node", signer) if isinstance(snapshot, dict) else signer
        if signer is not None and claimed != signer:
            raise wire.SignatureError(f"node {signer!r} signed a snapshot of another node")
    except wire.SignatureError as exc:
        _refuse(exc, auth, args)
        record_ingest(REJECTED, time.monotonic() - started)
        return REJECTED
    [result] = with_retries(lambda: ingest_snapshots([snapshot]), "storing a snapshot")
    record_ingest(result.outcome, time.monotonic() - started)
    if job_id is not None:
        finish_diagnosis(job_id, result, node=signer)
    return result.outcome


def _refuse(exc: wire.SignatureError, auth, args: list) -> None:
    claimed = args[0].get("node") if isinstance(args[0], dict) else None
    # The name comes from the message: bounded, and repr() so it cannot forge log lines.
    log.warning("refused a snapshot for node %s: %s", repr(claimed)[:wire.LINE_MAX], exc)
    if with_retries(lambda: credentials.signed_with_old_key(auth, wire.INGEST_TASK, args), "checking a signature"):
        show_rejection(auth["node"], str(exc), KEY_FIX.format(name=auth["node"]))


def with_retries(work, what: str, delays=RETRY_DELAYS_S):
    """`work()`, tried again after each of `delays` while the database is unreachable;
    the last error is raised (the worker logs it; the message, acked late, stays in
    the broker only if the worker dies meanwhile)."""
    for delay in (*delays, None):
        try:
            return work()
        except (OperationalError, InterfaceError) as exc:
            if delay is None:
                raise
            log.warning("database unreachable while %s (%s); retrying in %s s", what, exc, delay)
            close_old_connections()  # a broken connection is replaced on the next try
            time.sleep(delay)
    raise AssertionError("unreachable")


def store_with_retries(snapshots: list, delays=RETRY_DELAYS_S):
    """`ingest_snapshots`, with the retries of `with_retries`."""
    return with_retries(lambda: ingest_snapshots(snapshots), f"storing {len(snapshots)} snapshots", delays)
