"""The command lines of gpufleet's long-running processes, in one place. Each process is
a manage.py command (`web`, `ingest`, `beat`, `agent`): `manage.py up` writes those into a
Procfile and runs that, the systemd units in gpufleet/deploy/ run the same commands
(tests/core/test_deploy_units.py checks both), and each command runs its program's line
from here with the values of the settings, so no unit or Procfile holds a copy of one."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

PYTHON = sys.executable
_CELERY = [PYTHON, "-m", "celery", "-A", "gpufleet.celery"]
# Workers never talk to each other (no remote control between them): gossip and
# mingle would only add chatter on the broker.
_QUIET = ["--without-mingle", "--without-gossip"]


def command(name: str) -> list[str]:
    """A manage.py command, run from the checkout (the units' WorkingDirectory, up's cwd)."""
    return [PYTHON, "manage.py", name]


def ingest() -> list[str]:
    """One consumer of the agents' ingest stream (`manage.py ingest`). More of them, on
    this host or others, share the work: each reads its own batches of the group."""
    return command("ingest")


def agent() -> list[str]:
    """This host's agent as a command: `manage.py agent` runs `agent_worker` for the node
    that GPUFLEET_NODE_NAME names (default: the host name)."""
    return command("agent")


def gunicorn(bind: str, workers: int, threads: int, timeout: int) -> list[str]:
    """The web, as `manage.py web` runs it: gthread workers, whose main thread keeps
    checking in with gunicorn while its threads serve, so `timeout` kills a stuck worker,
    never a long download (a sync worker is killed mid-response and the download cut off)."""
    return [PYTHON, "-m", "gunicorn", "gpufleet.wsgi", "--bind", bind, "--workers", str(workers),
            "--worker-class", "gthread", "--threads", str(threads), "--timeout", str(timeout),
            "--access-logfile", "-"]


def central_beat(data_dir: Path) -> list[str]:
    """The central beat (exactly one per site) in a worker of its own that runs what the
    beat schedules (queue "housekeeping": offline marking, history rollups and retention,
    job expiry, claim release), so that work never delays ingest; `manage.py beat` runs it."""
    return [*_CELERY, "worker", "-Q", "housekeeping", "--pool", "solo", "-n", "housekeeping@%h", *_QUIET,
            "-B", "-s", str(data_dir / "beat-central"), "-l", "INFO"]


def agent_worker() -> list[str]:
    """This host's agent: the agent's own Celery app (gpufleet/agent/app.py, no Django),
    consuming its queue node.<GPUFLEET_NODE_NAME>, with the beat that schedules collect in
    a thread; its node, broker and data dir come from its environment."""
    return [PYTHON, "-m", "gpufleet.agent"]


def redis_server(binary: str, socket: Path, aclfile: Path) -> list[str]:
    """A private Redis for `up`: on a unix socket only its user may open, no TCP port,
    append-only (each write logged, synced every second), so messages queued when it
    stops or is killed are there when it starts again, and its users (no default one)
    in `aclfile`, as production's (gpufleet/core/broker_acl.py). No argument may be longer
    than an ingest entry's body may be (wire.ENTRY_BODY_MAX, which is also the least
    Redis takes): a node cannot make Redis hold a longer one."""
    return [binary, "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700",
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(socket.parent),
            "--proto-max-bulk-len", "1mb", "--aclfile", str(aclfile)]


def up_procfile(extra_agents: Iterable[str] = (), redis: list[str] | None = None) -> str:
    """The Procfile that `manage.py up` runs: web, the ingest consumer, the central beat with
    its housekeeping worker, this host's agent, and one more agent per name in
    `extra_agents` (a demo fleet); first the `redis` command line (`redis_server`) when
    there is one."""
    entries = {"redis": shlex.join(redis)} if redis else {}
    entries |= {name: shlex.join(command(name)) for name in ("web", "ingest", "beat", "agent")}
    for node in extra_agents:
        entries[f"agent-{node}"] = shlex.join(["env", f"GPUFLEET_NODE_NAME={node}", *agent()])
    return "".join(f"{name}: {line}\n" for name, line in entries.items())
