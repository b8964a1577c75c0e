"""Real Celery worker processes for integration tests, started the way the
deployment starts them (celery -A gpufleet.celery worker ...)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from django.db import connection

REPO = Path(__file__).resolve().parents[2]


def database_url_for_workers() -> str:
    """A DATABASE_URL for the database this test run uses (the test database)."""
    s = connection.settings_dict
    if s["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    def __init__(self, proc: subprocess.Popen, name: str):
        self.proc = proc
        self.name = name
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if " ready." in line:
                self.ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    def alive(self) -> bool:
        return self.proc.poll() is None


@contextlib.contextmanager
def celery_worker(name: str, queues: str, env: dict[str, str], beat_file: Path | None = None) -> Iterator[Worker]:
    argv = [sys.executable, "-m", "celery", "-A", "gpufleet.celery", "worker", "-Q", queues,
            "--pool", "solo", "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "-l", "INFO"]
    if beat_file is not None:
        argv += ["-B", "-s", str(beat_file)]
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full_env.pop("DJANGO_SETTINGS_MODULE", None)  # the deployment's settings, not the tests'
    proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    worker = Worker(proc, name)
    try:
        if not worker.ready.wait(60):
            raise AssertionError(f"worker {name} did not start:\n{worker.output}")
        yield worker
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


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


def send_snapshot(snap, node: str | None = None, **options) -> None:
    """Put `snap` on the broker for the ingest worker, signed by its node's agent (or by
    `node`, for one that names none)."""
    from gpufleet import wire
    from gpufleet.celery import app
    from tests.factories import agent_auth

    args = [snap, None]
    auth = agent_auth(node or snap["node"], wire.INGEST_TASK, args)
    app.send_task(wire.INGEST_TASK, args=args, kwargs={"auth": auth}, queue=wire.INGEST_QUEUE, **options)
