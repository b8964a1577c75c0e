"""The broker for the integration tests: real Redis (CI's, or a developer's on the
default port). The test process itself sends through the same broker as the
workers it starts."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.core.broker import client as _STREAM_CLIENT  # the real one, whatever a test patches
from tests.conftest import missing_service

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class Broker:
    kind: str
    url: str
    data_dir: Path
    transport_options: dict = field(default_factory=dict)

    stream: str = "gpufleet:ingest"

    def env(self) -> dict[str, str]:
        return {"CELERY_BROKER_URL": self.url, "GPUFLEET_DATA_DIR": str(self.data_dir),
                "GPUFLEET_INGEST_STREAM": self.stream}


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
    from django.conf import settings

    before = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url = settings.CELERY_BROKER_URL = url
    app.conf.broker_transport_options = options
    app._pool = None  # drop pooled connections to the previous broker
    app.amqp._producer_pool = None
    _STREAM_CLIENT.cache_clear()  # the same for the ingest stream's client
    return before


@pytest.fixture
def broker(tmp_path, monkeypatch, settings):
    """The shared Redis (CI's, or a developer's on the default port), with an ingest
    stream of the test's own."""
    from gpufleet.celery import app

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    url = _redis_url()
    _check_redis(url)
    chosen = Broker("redis", url, data_dir, dict(app.conf.broker_transport_options or {}),
                    stream=f"it-{uuid.uuid4().hex[:8]}:ingest")
    settings.GPUFLEET_INGEST_STREAM = chosen.stream
    # Celery prefers the CELERY_BROKER_URL environment variable over its config.
    monkeypatch.setenv("CELERY_BROKER_URL", chosen.url)
    before = _use_broker(app, chosen.url, chosen.transport_options)
    import redis

    from gpufleet.core import broker as stream_broker
    from gpufleet.fleet import broker_users

    shared = redis.Redis.from_url(url)
    broker_users.prepare(shared)  # the stream's append function, as a consumer's start loads it
    yield chosen
    _use_broker(app, *before)
    key = stream_broker.ingest_key(chosen.stream)
    shared.delete(key, stream_broker.deleted_key(key), *shared.keys(f"{key}:admitted:*"))
    shared.function_delete(stream_broker.append_function(chosen.stream))


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
    from gpufleet.fleet import broker_users

    broker_users.prepare(server.client())  # the append function, as a consumer's start loads it
    monkeypatch.setenv("CELERY_BROKER_URL", server.url)
    before = _use_broker(app, server.url, dict(app.conf.broker_transport_options or {}))
    try:
        yield server
    finally:
        _use_broker(app, *before)
        if server.proc.poll() is None:
            server.kill()


class OwnPostgres:
    """A PostgreSQL cluster of the test's own (initdb in a fresh folder, a free port,
    trust auth on loopback), migrated, that the test may stop and start again; never
    the shared server. As root the server runs as the `postgres` user, as PostgreSQL
    requires."""

    def __init__(self):
        import glob
        import shutil
        import socket
        import tempfile

        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")) or [shutil.which("pg_ctl")]
        if found[-1] is None:
            missing_service("PostgreSQL's server programs are not installed (apt-get install postgresql)")
        self.bin = Path(found[-1]).parent
        # Not under pytest's tmp_path: the postgres user must be able to reach it.
        self.folder = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.folder / "data"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/gpufleet"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def _run(self, program: str, *args: str) -> None:
        import subprocess

        argv = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"{program} failed ({done.returncode}):\n{done.stdout}{done.stderr}")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash as far as the clients can tell: connections cut mid-transaction."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def query(self, sql: str, params=()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def execute(self, sql: str, params=()) -> None:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5) as conn:
            conn.execute(sql, params)

    def create_and_migrate(self) -> None:
        import subprocess
        import sys

        import psycopg

        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE gpufleet")
        env = {**os.environ, "DATABASE_URL": self.url}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        repo = Path(__file__).resolve().parents[2]
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise AssertionError(f"migrate failed:\n{done.stdout}{done.stderr}")


@pytest.fixture
def own_postgres():
    """A migrated PostgreSQL of the test's own, started; removed afterwards."""
    import shutil

    server = OwnPostgres()
    try:
        server.start()
        server.create_and_migrate()
        yield server
    finally:
        if server.running():
            server.stop("immediate")
        shutil.rmtree(server.folder, ignore_errors=True)
