"""The command lines of gpufleet's long-running processes, in one place, so
`manage.py up`, `manage.py agent` and the unit files start them the same way."""

from __future__ import annotations

import sys
from pathlib import Path

_CELERY = [sys.executable, "-m", "celery", "-A", "gpufleet.celery"]
# The file broker has no use for gossip and mingle; on Redis they only add chatter.
_QUIET = ["--without-mingle", "--without-gossip"]


def web(bind: str, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", "gunicorn", "gpufleet.wsgi", "--bind", bind, "--workers", str(workers),
            "--access-logfile", "-"]


def ingest_worker(data_dir: Path, with_beat: bool = False) -> list[str]:
    """The central worker (queue "ingest"); `with_beat` embeds the central beat."""
    argv = [*_CELERY, "worker", "-Q", "ingest", "--pool", "solo", "-n", "ingest@%h", *_QUIET, "-l", "INFO"]
    if with_beat:
        argv += ["-B", "-s", str(data_dir / "beat-central")]
    return argv


def agent_worker(node: str, data_dir: Path) -> list[str]:
    """A node's agent: its own queue node.<name>, with the beat that schedules collect.
    Run with GPUFLEET_ROLE=agent so beat loads the agent's schedule."""
    return [*_CELERY, "worker", "-Q", f"node.{node}", "-B", "-s", str(data_dir / f"beat-agent-{node}"),
            "--pool", "solo", "-n", f"agent.{node}@%h", *_QUIET, "-l", "INFO"]
