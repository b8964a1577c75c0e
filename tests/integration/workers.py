"""Real worker processes for integration tests, started the way the deployment starts
them: central Celery workers (celery -A gpufleet.celery worker ...), agents (launch.agent_worker)
and ingest consumers (manage.py ingest)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from django.db import connection

from gpufleet.core import launch
from gpufleet.tools.workers import REPO, WorkerDidNotStart, WorkerProcess, database_url, running_worker

__all__ = ["REPO", "agent_key_env", "agent_process", "celery_worker", "database_url_for_workers", "ingest_consumer", "send_snapshot",
           "wait_for"]


def database_url_for_workers() -> str:
    """A DATABASE_URL for the database this test run uses (the test database)."""
    return database_url(connection.settings_dict)


@contextlib.contextmanager
def celery_worker(name: str, queues: str, env: dict[str, str], beat_file: Path | None = None) -> Iterator[WorkerProcess]:
    argv = [sys.executable, "-m", "celery", "-A", "gpufleet.celery", "worker", "-Q", queues,
            "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "-l", "INFO", "--pool", "solo"]
    if beat_file is not None:
        argv += ["-B", "-s", str(beat_file)]
    try:
        with running_worker(argv, env, name) as worker:
            yield worker
    except WorkerDidNotStart as exc:
        raise AssertionError(str(exc)) from None


@contextlib.contextmanager
def agent_process(env: dict[str, str]) -> Iterator[WorkerProcess]:
    """A node's agent as a GPU host runs it (launch.agent_worker: its node, broker and data
    dir from `env`), until it says it is ready; stopped on leaving."""
    try:
        with running_worker(launch.agent_worker(), env, "agent") as worker:
            yield worker
    except WorkerDidNotStart as exc:
        raise AssertionError(str(exc)) from None


@contextlib.contextmanager
def ingest_consumer(env: dict[str, str], name: str = "ingest") -> Iterator[WorkerProcess]:
    """`manage.py ingest` (launch.ingest), until it says it is ready; stopped on leaving."""
    try:
        with running_worker(launch.ingest(), env, name) as consumer:
            yield consumer
    except WorkerDidNotStart as exc:
        raise AssertionError(str(exc)) from None


def wait_for(predicate, timeout: float, what: str, workers=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        for w in workers:
            if not w.alive():
                raise AssertionError(f"worker {w.name} died while waiting for {what}:\n{w.output}")
        time.sleep(0.2)
    logs = "\n".join(f"--- {w.name}\n{w.output}" for w in workers)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")


def agent_key_env(node: str) -> dict[str, str]:
    """The setting an agent worker for `node` needs, the node enrolled (as
    `manage.py enroll` prints it) in the database the workers share with the test."""
    from gpufleet.fleet import credentials

    return {"GPUFLEET_AGENT_KEY": str(credentials.enroll(node))}


def send_snapshot(snap, node: str | None = None, key=None, to=None) -> bytes:
    """Append `snap` to the ingest stream (the settings' broker, or the client `to`),
    signed by its node's agent (or by `node`, for one that names none; with `key`, by that key)."""
    from gpufleet.core import broker
    from tests.factories import agent_entry

    return broker.append(agent_entry(snap, node=node, key=key), to or broker.client())
