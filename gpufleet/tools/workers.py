"""A Celery worker as a child process, started from a command line of
gpufleet.core.launch and stopped again. `manage.py bench` measures the real worker
this way and the integration tests fault it (kill it, restart its broker), which an
in-process worker could not show."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 15


class WorkerDidNotStart(RuntimeError):
    pass


class WorkerProcess:
    """A started worker and what it printed (tests look for log lines; messages
    about a failure quote the last ones)."""

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

    def stop(self) -> None:
        """SIGTERM (a warm shutdown: the task in hand finishes), then SIGKILL to the
        whole process group if it has not exited in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@contextlib.contextmanager
def running_worker(argv: list[str], env: dict[str, str], name: str) -> Iterator[WorkerProcess]:
    """Run `argv` in the repository with the deployment's settings (os.environ and
    `env`, never the caller's DJANGO_SETTINGS_MODULE) until the worker says it is
    ready; stop it on leaving."""
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    full_env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    worker = WorkerProcess(proc, name)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not worker.ready.wait(0.2):
            if not worker.alive() or time.monotonic() > deadline:
                raise WorkerDidNotStart(f"worker {name} did not start:\n{worker.output}")
        yield worker
    finally:
        worker.stop()


def database_url(settings_dict: dict) -> str:
    """A DATABASE_URL naming the database of `settings_dict` (a connection's), so a
    child process uses the database its parent uses now (a test or bench database)."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    auth = quote(settings_dict["USER"], safe="")
    if settings_dict["PASSWORD"]:
        auth += ":" + quote(settings_dict["PASSWORD"], safe="")
    host = settings_dict["HOST"] or "127.0.0.1"
    return f"postgres://{auth}@{host}:{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
