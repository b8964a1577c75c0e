"""The broker for the integration tests: real Redis (CI's, or a developer's on the
default port). The test process itself sends through the same broker as the
workers it starts."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import missing_service

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class Broker:
    kind: str
    url: str
    data_dir: Path
    transport_options: dict = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return {"CELERY_BROKER_URL": self.url, "GPUFLEET_DATA_DIR": str(self.data_dir)}


def _redis_url() -> str:
    url = os.environ.get("CELERY_BROKER_URL", "")
    return url if url.startswith("redis://") else DEFAULT_REDIS


def _check_redis(url: str) -> None:
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping()
    except redis.RedisError as exc:
        missing_service(f"Redis at {url} is not reachable ({exc})")


def _use_broker(app, url: str, options: dict) -> tuple:
    before = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url = url
    app.conf.broker_transport_options = options
    app._pool = None  # drop pooled connections to the previous broker
    app.amqp._producer_pool = None
    return before


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """The shared Redis (CI's, or a developer's on the default port)."""
    from gpufleet.celery import app

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    url = _redis_url()
    _check_redis(url)
    chosen = Broker("redis", url, data_dir, dict(app.conf.broker_transport_options or {}))
    # Celery prefers the CELERY_BROKER_URL environment variable over its config.
    monkeypatch.setenv("CELERY_BROKER_URL", chosen.url)
    before = _use_broker(app, chosen.url, chosen.transport_options)
    yield chosen
    _use_broker(app, *before)


@pytest.fixture
def node_name() -> str:
    # Unique per test: Redis queues outlive a test run.
    return f"it-{uuid.uuid4().hex[:8]}"


class OwnRedis:
    """A redis-server of the test's own, on a free TCP port, append-only in a
    private folder (as `up`'s is), that the test may kill and start again."""

    def __init__(self, folder: Path):
        import shutil
        import socket

        self.binary = shutil.which("redis-server")
        if self.binary is None:
            missing_service("redis-server is not installed (apt-get install redis-server)")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self) -> None:
        import subprocess
        import time

        import redis

        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url, socket_timeout=1).ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=2)


@pytest.fixture
def own_redis(tmp_path, monkeypatch):
    """A Redis of the test's own, started; every message this test sends goes to it."""
    from gpufleet.celery import app

    folder = tmp_path / "redis"
    folder.mkdir()
    server = OwnRedis(folder)
    server.start()
    monkeypatch.setenv("CELERY_BROKER_URL", server.url)
    before = _use_broker(app, server.url, dict(app.conf.broker_transport_options or {}))
    try:
        yield server
    finally:
        _use_broker(app, *before)
        if server.proc.poll() is None:
            server.kill()
