"""Ingest beyond one host: a broker host, a database host and two ingest hosts, each a
network namespace of its own with its own address on one bridge (four machines on one
network, as docs/scaling.md draws them), and the test itself as the agents' host on
that bridge. The broker host runs its own redis-server (the centre's user, no default
user, a node user for the agents, as production's), the database host its own
PostgreSQL, each ingest host a real `manage.py ingest` of the one consumer group. One
ingest host's consumer is killed (SIGKILL) while it holds entries it read and had not
acknowledged; the other takes them over (XAUTOCLAIM after
GPUFLEET_BROKER_VISIBILITY_TIMEOUT) and every snapshot is stored exactly once.

Needs root, iproute2, PostgreSQL's server programs and redis-server (missing: skipped,
or failed in CI). The namespaces are named after the run, so two runs never meet, and
are removed with whatever runs in them, pass or fail."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet import wire
from gpufleet.core import broker, broker_acl, launch
from gpufleet.fleet import broker_users, credentials
from gpufleet.tools.workers import WorkerDidNotStart, running_worker
from tests.conftest import missing_service
from tests.factories import snapshot
from tests.integration.workers import REPO, wait_for

pytestmark = [pytest.mark.integration]

SUBNET = "10.77.0"
AGENTS = "agents"  # the test's own host, which holds the bridge
HOSTS = {"broker": 2, "db": 3, "ingest-a": 11, "ingest-b": 12}
CLONE_NEWNET = 0x40000000
CENTRE_PASSWORD = "centre-password-for-tests"
AGENTS_PASSWORD = "agents-password-for-tests"
NODES, GPUS, WAVES = 300, 2, 5
KILL_WAVE = 2  # the wave during which ingest-a dies; the later ones ingest-b stores alone
BATCH = "50"  # small batches: each host holds one most of the time while a wave is stored
HELD_AT_LEAST = 10


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


class Fabric:
    """The namespaces of one run: AGENTS with the bridge and HOSTS each on a veth pair into it."""

    def __init__(self):
        self.prefix = f"gf{uuid.uuid4().hex[:8]}"
        self.made: list[str] = []

    def ns(self, role: str) -> str:
        return f"{self.prefix}-{role}"

    @staticmethod
    def address(role: str) -> str:
        return f"{SUBNET}.{HOSTS[role]}"

    def exec(self, role: str) -> list[str]:
        """The prefix of a command line run on `role`'s host."""
        return ["ip", "netns", "exec", self.ns(role)]

    def build(self) -> None:
        switch = self.ns(AGENTS)
        done = subprocess.run(["ip", "netns", "add", switch], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            missing_service(f"`ip netns add` failed: {done.stderr.strip()}")
        self.made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "addr", "add", f"{SUBNET}.1/24", "dev", "br0")
        for dev in ("lo", "br0"):
            _ip("-n", switch, "link", "set", dev, "up")
        for role in HOSTS:
            ns, port = self.ns(role), f"v-{role}"  # an interface's name is at most 15 bytes
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(role)}/24", "dev", "eth0")
            for dev in ("lo", "eth0"):
                _ip("-n", ns, "link", "set", dev, "up")

    def remove(self) -> None:
        """Whatever still runs in the namespaces (all of it this test's) killed, then each removed."""
        for ns in reversed(self.made):
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _enter(ns: str) -> None:
    # setns moves the calling thread only: the test's other threads stay where they were.
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


class Host:
    """Calls run on the agents' host: in a thread inside its namespace, so the sockets they open are there."""

    def __init__(self, ns: str):
        self.pool = ThreadPoolExecutor(1, initializer=_enter, initargs=(ns,))

    def __call__(self, work, *args):
        return self.pool.submit(work, *args).result()


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        missing_service("PostgreSQL's server programs are not installed (apt-get install postgresql)")
    return Path(found[-1]).parent


def _as_postgres(argv: list[str], prefix: list[str] = ()) -> None:
    done = subprocess.run([*prefix, "runuser", "-u", "postgres", "--", *argv], capture_output=True, text=True,
                          timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"{argv[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def _hosts():
    """(fabric, agents' host, folder) with the database and broker hosts' servers running."""
    if os.geteuid() != 0:
        missing_service("network namespaces need root")
    for program in ("ip", "runuser", "redis-server"):
        if shutil.which(program) is None:
            missing_service(f"{program} is not installed (iproute2, util-linux, redis-server)")
    pg = _postgres_bin()
    fabric = Fabric()
    # Not under pytest's tmp_path: the postgres user must reach it.
    folder = Path(tempfile.mkdtemp(prefix="gf-hosts-"))
    host = redis_server = None
    try:
        fabric.build()
        host = Host(fabric.ns(AGENTS))
        shutil.chown(folder, "postgres", "postgres")
        data = folder / "pg"
        _as_postgres([str(pg / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        options = f"-p 5432 -k {folder} -c listen_addresses={fabric.address('db')} -c fsync=off"
        _as_postgres([str(pg / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "pg.log"), "-w", "start"],
                     fabric.exec("db"))
        aclfile = folder / "users.acl"
        broker_acl.write_aclfile(aclfile, [broker_acl.aclfile_line(broker_acl.CENTRE_USER, CENTRE_PASSWORD,
                                                                   broker_acl.centre_rules())],
                                 [broker_acl.CENTRE_USER])
        redis_server = subprocess.Popen(
            [*fabric.exec("broker"), shutil.which("redis-server"), "--port", "6379", "--bind", fabric.address("broker"),
             "--save", "", "--appendonly", "no", "--dir", str(folder), "--aclfile", str(aclfile)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        yield fabric, host, folder
    finally:
        if (folder / "pg" / "postmaster.pid").exists():
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                _as_postgres([str(pg / "pg_ctl"), "-D", str(folder / "pg"), "-m", "immediate", "-w", "stop"])
        if redis_server is not None:
            redis_server.terminate()
            redis_server.wait(10)
        if host is not None:
            host.pool.shutdown()
        fabric.remove()
        shutil.rmtree(folder, ignore_errors=True)


def _connect_when_up(connect, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect()
        except Exception as exc:  # not up yet: refused, or no route while the links come up
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not answer: {exc}") from exc
            time.sleep(0.1)


def test_two_ingest_hosts_store_every_snapshot_once_with_one_killed():
    import psycopg
    import redis

    with _hosts() as (fabric, host, folder):
        broker_address, db_address = fabric.address("broker"), fabric.address("db")
        db_url = f"postgres://postgres@{db_address}:5432/gpufleet"
        centre_url = f"redis://{broker_acl.CENTRE_USER}:{CENTRE_PASSWORD}@{broker_address}:6379/0"

        def setup():
            with _connect_when_up(lambda: psycopg.connect(f"postgres://postgres@{db_address}:5432/postgres",
                                                          autocommit=True, connect_timeout=2), "PostgreSQL") as conn:
                conn.execute("CREATE DATABASE gpufleet")
            centre = _connect_when_up(lambda: _pinged(redis.Redis.from_url(centre_url, socket_timeout=5)), "Redis")
            broker_acl.put_node_user(centre, "agents", AGENTS_PASSWORD, broker.ingest_key())
            # The append function, as the consumers load it once they run: the agents append at once.
            broker_users.prepare(centre)
            return centre

        centre = host(setup)
        env = {"DATABASE_URL": db_url, "CELERY_BROKER_URL": centre_url, "GPUFLEET_BROKER_VISIBILITY_TIMEOUT": "2",
               "GPUFLEET_INGEST_BATCH": BATCH, "GPUFLEET_INGEST_CAP_PER_INTERVAL": str(10 * WAVES),
               "PROMETHEUS_MULTIPROC_DIR": str(folder / "metrics")}
        (folder / "metrics").mkdir()
        full_env = {**os.environ, **env}
        full_env.pop("DJANGO_SETTINGS_MODULE", None)  # the deployment's settings, as the hosts run them
        migrated = subprocess.run([*fabric.exec("ingest-a"), sys.executable, "manage.py", "migrate", "--noinput"],
                                  cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr

        names = [f"far-{i:04}" for i in range(NODES)]
        keys = {name: credentials.node_key(name, 1) for name in names}
        base = (datetime.now(UTC) - timedelta(minutes=2)).replace(microsecond=0)
        waves = [base + timedelta(seconds=w) for w in range(WAVES)]
        db = host(lambda: psycopg.connect(db_url, autocommit=True, connect_timeout=5))
        host(db.execute, "INSERT INTO fleet_nodecredential (name, generation, issued_at) "
                         "SELECT unnest(%s::text[]), 1, now()", [names])
        agents = host(lambda: redis.Redis(host=broker_address, port=6379, username=broker_acl.node_user("agents"),
                                          password=AGENTS_PASSWORD, socket_timeout=5))
        stream, sent = broker.ingest_key(), {}

        def append(at: datetime) -> None:
            entries = [wire.encode_entry(keys[name], name, wire.SNAPSHOT,
                                         [wire.encode_snapshot(snapshot(name, GPUS, at=at)), None]) for name in names]

            def send():
                with agents.pipeline(transaction=False) as pipe:
                    for fields in entries:
                        broker.append(fields, pipe)
                    return pipe.execute()

            sent.update(dict.fromkeys(host(send), at))

        def stored(at: datetime) -> int:
            return host(lambda: db.execute("SELECT count(*) FROM fleet_devicesample WHERE collected_at = %s",
                                           [at]).fetchone()[0])

        def held_by(consumer: str) -> list:
            return host(lambda: centre.xpending_range(stream, wire.INGEST_GROUP, "-", "+", 10_000,
                                                      consumername=consumer))

        with _on(fabric, "ingest-a", env, folder) as doomed, _on(fabric, "ingest-b", env, folder) as survivor:
            doomed_name = _consumer_name(doomed)
            held: list = []
            for wave, at in enumerate(waves):
                append(at)
                if wave == KILL_WAVE:
                    # Killed the moment it is seen holding a batch (the first entry of a wave
                    # may wake it alone): in the midst of storing it.
                    deadline = time.monotonic() + 20
                    while len(held_by(doomed_name)) < HELD_AT_LEAST and time.monotonic() < deadline:
                        time.sleep(0.002)
                    doomed.proc.send_signal(signal.SIGKILL)
                    doomed.proc.wait()
                    held = held_by(doomed_name)
                    assert held, "ingest-a acknowledged all it held before it died: the test proves nothing"
                alive = (survivor,) if wave >= KILL_WAVE else (doomed, survivor)
                # At least: one stored twice is for the assertions below to name.
                wait_for(lambda a=at: stored(a) >= NODES * GPUS, 60, f"wave {wave} stored", alive)
            wait_for(lambda: host(lambda: centre.xlen(stream) == 0
                                  and centre.xpending(stream, wire.INGEST_GROUP)["pending"] == 0),
                     20, "the stream drained", (survivor,))
            assert any("took over" in line for line in survivor.lines), survivor.output

        # Every snapshot, those ingest-a held when it died too, stored exactly once: one
        # sample of each GPU at each node's every collection, and each node at its last.
        rows = host(lambda: db.execute(
            """SELECT n.name, s.collected_at, count(*) FROM fleet_devicesample s
               JOIN fleet_device d ON d.id = s.device_id JOIN fleet_node n ON n.id = d.node_id
               GROUP BY n.name, s.collected_at""").fetchall())
        assert {(name, at) for name, at, _ in rows} == {(name, at) for name in names for at in waves}
        assert {count for *_, count in rows} == {GPUS}
        last = dict(host(lambda: db.execute("SELECT name, collected_at FROM fleet_node").fetchall()))
        assert last == dict.fromkeys(names, waves[-1])
        held_ids = {entry["message_id"] for entry in held}
        assert held_ids <= sent.keys() and {sent[i] for i in held_ids} == {waves[KILL_WAVE]}
        host(db.close)


def _pinged(client):
    client.ping()
    return client


def _consumer_name(worker) -> str:
    """The consumer's name in the group, from its ready line."""
    line = next(line for line in worker.lines if " ready." in line)
    return line.split("ingest consumer ", 1)[1].split(" on stream ", 1)[0]


@contextlib.contextmanager
def _on(fabric: Fabric, role: str, env: dict[str, str], folder: Path):
    """A real `manage.py ingest` on `role`'s host, until it says it is ready; stopped on leaving."""
    data = folder / role
    data.mkdir(exist_ok=True)
    try:
        with running_worker([*fabric.exec(role), *launch.ingest()], {**env, "GPUFLEET_DATA_DIR": str(data)},
                            role) as worker:
            yield worker
    except WorkerDidNotStart as exc:
        raise AssertionError(str(exc)) from None
