"""The settings a node's agent runs with, read from the environment by the rules of
gpufleet/env.py without Django: the agent process (gpufleet/agent/app.py) never loads
the site's settings, its apps or its database layer. The central settings.py takes the
same variables from `from_environment` (one rule each) and the Celery options both
sides share from `celery_options`.

Inside the site (`manage.py collect --once`, tests) `current()` answers the site's
settings instead: they hold the same values unless a test overrides one."""

from __future__ import annotations

import functools
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.core import broker_acl
from gpufleet.env import env_float, env_int, env_list, read_private_text

BASE_DIR = Path(__file__).resolve().parents[2]
# The name of the agent's Celery app (gpufleet/agent/app.py), by which a signal
# handler tells the agent's worker from the central ones.
AGENT_APP = "gpufleet-agent"


@dataclass
class AgentSettings:
    """What the agent reads, under the names the site's settings give the same values."""

    DATA_DIR: Path
    GPUFLEET_NODE_NAME: str
    GPUFLEET_COLLECT_INTERVAL: float
    GPUFLEET_VRAM_WARN_PERCENT: float
    GPUFLEET_TEMPERATURE_WARN_C: float
    GPUFLEET_XID_WINDOW_HOURS: float
    GPUFLEET_THROTTLE_WARN_SHARE: float
    GPUFLEET_DOCKER_TIMEOUT: float
    GPUFLEET_AGENT_FIXES: list[str]
    GPUFLEET_JOB_TIMEOUT: float
    GPUFLEET_DCGM_DIAG_TIMEOUT: float
    GPUFLEET_AGENT_KEY: str
    GPUFLEET_INGEST_STREAM: str
    GPUFLEET_INGEST_STREAM_MAXLEN: int
    GPUFLEET_BROKER_VISIBILITY_TIMEOUT: float
    CELERY_BROKER_URL: str
    CELERY_BROKER_CONNECTION_TIMEOUT: float
    PRIVATE_REDIS_SOCKET: Path = field(repr=False, default=Path())
    PRIVATE_REDIS_PASSWORD_FILE: Path = field(repr=False, default=Path())


def data_dir() -> Path:
    """Where the embedded defaults keep their state (GPUFLEET_DATA_DIR, default var/)."""
    return Path(os.environ.get("GPUFLEET_DATA_DIR", BASE_DIR / "var")).resolve()


def from_environment() -> AgentSettings:
    data = data_dir()
    node = os.environ.get("GPUFLEET_NODE_NAME") or socket.gethostname()
    # With CELERY_BROKER_URL unset, `up`'s private Redis on this socket, as the centre's user.
    private_socket, password_file = data / "redis.sock", data / "redis-centre.password"
    return AgentSettings(
        DATA_DIR=data,
        GPUFLEET_NODE_NAME=node,
        GPUFLEET_COLLECT_INTERVAL=env_float("GPUFLEET_COLLECT_INTERVAL", 30.0, minimum=1.0),
        # Out-of-range values are ignored by the diagnosis itself (it falls back to 90).
        GPUFLEET_VRAM_WARN_PERCENT=env_float("GPUFLEET_VRAM_WARN_PERCENT", 90.0),
        GPUFLEET_TEMPERATURE_WARN_C=env_float("GPUFLEET_TEMPERATURE_WARN_C", 85.0, minimum=1.0),
        GPUFLEET_XID_WINDOW_HOURS=env_float("GPUFLEET_XID_WINDOW_HOURS", 24.0, minimum=0.1),
        # A share of 1 or more can never be passed: it turns the warning off.
        GPUFLEET_THROTTLE_WARN_SHARE=env_float("GPUFLEET_THROTTLE_WARN_SHARE", 0.25, minimum=0.0),
        GPUFLEET_DOCKER_TIMEOUT=env_float("GPUFLEET_DOCKER_TIMEOUT", 5.0, minimum=0.1),
        GPUFLEET_AGENT_FIXES=env_list("GPUFLEET_AGENT_FIXES", []),
        GPUFLEET_JOB_TIMEOUT=env_float("GPUFLEET_JOB_TIMEOUT", 60.0, minimum=1.0),
        # The longest a DCGM diagnostic may run (-r 2 on eight GPUs takes minutes); the site
        # waits this long past the job timeout before it calls the job unanswered.
        GPUFLEET_DCGM_DIAG_TIMEOUT=env_float("GPUFLEET_DCGM_DIAG_TIMEOUT", 900.0, minimum=10.0),
        # As `manage.py enroll NODE` prints it; `up` leaves its local agents' keys in the
        # data dir instead, readable by their user only.
        GPUFLEET_AGENT_KEY=os.environ.get("GPUFLEET_AGENT_KEY", "").strip()
        or read_private_text(data / f"agent-{node}.key"),
        GPUFLEET_INGEST_STREAM=os.environ.get("GPUFLEET_INGEST_STREAM", "gpufleet:ingest"),
        GPUFLEET_INGEST_STREAM_MAXLEN=env_int("GPUFLEET_INGEST_STREAM_MAXLEN", 200_000, minimum=1000),
        GPUFLEET_BROKER_VISIBILITY_TIMEOUT=env_float("GPUFLEET_BROKER_VISIBILITY_TIMEOUT", 300.0, minimum=1.0),
        CELERY_BROKER_URL=os.environ.get("CELERY_BROKER_URL") or broker_acl.private_url(private_socket, password_file),
        CELERY_BROKER_CONNECTION_TIMEOUT=env_float("CELERY_BROKER_CONNECTION_TIMEOUT", 4.0),
        PRIVATE_REDIS_SOCKET=private_socket,
        PRIVATE_REDIS_PASSWORD_FILE=password_file,
    )


@functools.cache
def _alone() -> AgentSettings:
    return from_environment()


def current() -> Any:
    """The site's settings inside the site, else this process's AgentSettings (read once)."""
    conf = sys.modules.get("django.conf")
    if conf is not None and conf.settings.configured:
        return conf.settings
    return _alone()


def broker_transport_options(visibility_timeout: float) -> dict[str, Any]:
    return {
        "visibility_timeout": visibility_timeout,
        # kombu looks for unacknowledged messages every interval × throttle seconds (100 s
        # by default); one cheap index scan every 10 s (or per timeout, if shorter) bounds
        # the redelivery at the timeout plus that.
        "unacked_restore_interval": min(10, visibility_timeout),
        "unacked_restore_throttle": 1,
        # The lock a sweep holds, which a worker killed mid-sweep leaves behind: kombu's
        # 300 s default then stops every sweep for five minutes. A sweep takes
        # milliseconds; a second one overlapping it at worst hands a message out twice,
        # which ingest ignores as stale and agents refuse as a job already run.
        "unacked_mutex_expire": min(10, visibility_timeout),
    }


# What every gpufleet worker and sender agrees on (settings.py takes them as CELERY_*).
CELERY_SHARED: dict[str, Any] = {
    "broker_connection_retry_on_startup": True,
    # A worker that loses the broker keeps trying (never exits).
    "broker_connection_max_retries": None,
    "task_serializer": "json",
    "result_serializer": "json",
    "accept_content": ["json"],
    # Compressed, a backlog of tasks holds less of the broker's memory; workers inflate
    # compressed and plain messages alike.
    "task_compression": "zlib",
    "task_ignore_result": True,
    "task_time_limit": 120,
    "task_soft_time_limit": 100,
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    # Nothing sends the workers remote-control commands (celery inspect/control), and
    # each worker otherwise keeps a Redis pub/sub connection for them.
    "worker_enable_remote_control": False,
    "worker_send_task_events": False,
}


def agent_beat_schedule(s: Any) -> dict[str, Any]:
    """The agent's own schedule: collect this host every GPUFLEET_COLLECT_INTERVAL."""
    return {
        "collect": {
            "task": "gpufleet.agent.tasks.collect",
            "schedule": s.GPUFLEET_COLLECT_INTERVAL,
            "options": {"queue": f"node.{s.GPUFLEET_NODE_NAME}", "expires": s.GPUFLEET_COLLECT_INTERVAL},
        },
    }


def agent_celery_options(s: Any) -> dict[str, Any]:
    """The agent's Celery configuration: the shared options, its broker, and every key of
    its queue (the queue, its unacknowledged index, its bindings) under the node's own
    prefix: the only keys its broker user may use."""
    return {
        **CELERY_SHARED,
        "broker_url": s.CELERY_BROKER_URL,
        "broker_connection_timeout": s.CELERY_BROKER_CONNECTION_TIMEOUT,
        "broker_transport_options": {**broker_transport_options(s.GPUFLEET_BROKER_VISIBILITY_TIMEOUT),
                                     "global_keyprefix": broker_acl.node_key_prefix(s.GPUFLEET_NODE_NAME)},
        # kombu's redelivery sweep releases its lock by EVALSHA of a script only the centre
        # may load (broker_users.prepare): when Redis restarted with an empty script cache
        # and the centre has not loaded it yet, the refusal is a channel error, and the
        # worker connects again (as after a lost connection) instead of exiting.
        "broker_channel_error_retry": True,
        "task_default_queue": f"node.{s.GPUFLEET_NODE_NAME}",
        "beat_schedule": agent_beat_schedule(s),
    }


def agent_worker_options(s: Any) -> dict[str, Any]:
    """How the agent's app runs its worker (gpufleet/agent/app.py `run`): on its node's
    queue, one task at a time in the worker's own process, with the beat's schedule kept
    in the data dir."""
    node = s.GPUFLEET_NODE_NAME
    return {
        "hostname": f"agent.{node}@{socket.gethostname()}",
        "queues": [f"node.{node}"],
        "pool_cls": "solo",
        "loglevel": "INFO",
        "schedule_filename": str(s.DATA_DIR / f"beat-agent-{node}"),
        # Workers never talk to each other and nothing listens for worker events; and its
        # broker user may send nothing but its own queue's commands and the append (broker_acl).
        "without_mingle": True,
        "without_gossip": True,
        "without_heartbeat": True,
    }


def logging_config() -> dict[str, Any]:
    """The logging of every gpufleet process (settings.LOGGING; the agent's app applies it
    itself): LOG_LEVEL for gpufleet's own loggers."""
    level = os.environ.get("LOG_LEVEL", "INFO")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
        # The one console handler, on the root: a Celery worker replaces the root's handlers
        # with its own, so each line is printed once there too (a handler on "gpufleet" as
        # well printed every line of a worker twice).
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {
            "gpufleet": {"level": level},
            # Django's warnings and errors: a 500 from django.request comes with its traceback
            # (the formatter appends it). Django's default sends them nowhere unless DEBUG.
            "django": {"handlers": [], "level": "WARNING"},
            # Celery's lines for every task received and done and every beat tick: the
            # housekeeping beat alone wrote one every few seconds. Failures are errors and
            # still show; LOG_LEVEL=DEBUG brings the rest back.
            **{
                name: {"level": "INFO" if level == "DEBUG" else "WARNING"}
                for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
            },
        },
    }
