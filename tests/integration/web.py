"""`manage.py web` (gunicorn, as gpufleet/core/launch.py runs it) on a free port of
127.0.0.1, serving the test database, for the tests that need the real web: its worker
processes and threads, not the test client in the test's own process."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time

from django.conf import settings

from gpufleet.core import launch
from tests.integration.workers import REPO, database_url_for_workers
from tests.receivers import free_port


class Web:
    """The web on the test database, logging to a file; `workers` gunicorn processes,
    each with the threads GPUFLEET_WEB_THREADS in `env` gives it."""

    def __init__(self, log_path, env: dict[str, str], workers: int = 1):
        self.port = free_port()
        self.log_path = log_path
        full_env = {**os.environ, **env, "DATABASE_URL": database_url_for_workers(), "SECRET_KEY": settings.SECRET_KEY,
                    "ALLOWED_HOSTS": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        full_env.pop("DJANGO_SETTINGS_MODULE", None)
        argv = [*launch.command("web"), "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers)]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the web exited with {self.proc.returncode}:\n{self.log()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/accounts/login/")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.2)
        raise AssertionError(f"the web did not answer in {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
