"""What the tests' own directory and OpenID provider share: a server process started once
per test session, at the first test that needs it, and stopped with its scratch folder
when the session ends."""

from __future__ import annotations

import atexit
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar


class Server(Protocol):
    folder: Path
    proc: subprocess.Popen


S = TypeVar("S", bound=Server)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def once(start: Callable[[], S]) -> Callable[[], S]:
    """`start` made to run once: later calls give the same server, removed at exit."""
    started: list[S] = []

    def get() -> S:
        if not started:
            server = start()
            started.append(server)
            atexit.register(lambda: (stop(server.proc), shutil.rmtree(server.folder, ignore_errors=True)))
        return started[0]

    return get
