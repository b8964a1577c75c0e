"""A flood on the ingest stream with one node's broker credentials, on a redis-server
started with `up`'s own command line and users (no default user, the centre's, one per
node): node B appends 100,000 entries through the stream's append function (junk, which
the function refuses, entries naming made-up nodes, entries naming node A with bad
signatures, entries signed with B's own key far past its cap) and 50 zlib bombs, and
node A's next snapshot, behind them all, is still stored; B's refusals are counted, A is
not failed, and no more of B's flood is inflated or stored than its cap. How long A's
snapshot waits is a figure of `manage.py bench` (gpufleet/tools/bench_flood.py), beside
the collect interval. Redis itself refuses a body longer than the wire bound, and any
entry of other fields."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
import time
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.utils import timezone

from gpufleet import wire
from gpufleet.core import broker, broker_acl, launch
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import DeviceSample, Health, Node, Refusal
from gpufleet.ingest import stream
from gpufleet.ingest.services import ACCEPTED
from gpufleet.tools import bench_flood
from tests.conftest import missing_service
from tests.factories import snapshot

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

STREAM = "gpufleet:ingest"
# The collect interval, which is also the window of a node's admission cap: longer than
# the flood takes to handle on any machine, so that B's cap holds over all of it.
INTERVAL_S = 3600.0
CAP = 4
FLOOD = 100_000
BOMBS = 50


class UpRedis:
    """redis-server as `up` starts it (launch.redis_server), in a folder of its own."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing_service("redis-server is not installed (apt-get install redis-server)")
        # Short: a unix socket's path may not be longer than 107 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="gf-flood-", dir="/tmp"))
        self.socket = self.folder / "redis.sock"
        aclfile = self.folder / "users.acl"
        self.password = secrets.token_urlsafe(16)
        line = broker_acl.aclfile_line(broker_acl.CENTRE_USER, self.password, broker_acl.centre_rules())
        broker_acl.write_aclfile(aclfile, [line], [broker_acl.CENTRE_USER])
        self.proc = subprocess.Popen(launch.redis_server(binary, self.socket, aclfile),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.url = f"redis+socket://{broker_acl.CENTRE_USER}:{self.password}@{self.socket}"
        deadline = time.monotonic() + 10
        while True:
            try:
                self.login(broker_acl.CENTRE_USER, self.password).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def login(self, user: str, password: str) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), username=user, password=password, socket_timeout=30)

    def node(self, name: str) -> redis.Redis:
        """A client logged in as `name`'s own user, as its agent is (made as enroll makes it)."""
        return self.login(broker_acl.node_user(name), broker_users.make(name))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def up_redis(settings):
    settings.GPUFLEET_INGEST_STREAM = STREAM
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL_S
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = CAP
    server = UpRedis()
    settings.CELERY_BROKER_URL = server.url
    try:
        yield server
    finally:
        server.stop()


def test_node_as_next_snapshot_is_stored_behind_a_flood_and_bombs_from_node_b(up_redis, monkeypatch):
    key_a, key_b = credentials.enroll("node-a"), credentials.enroll("node-b")
    agent_a, agent_b = up_redis.node("node-a"), up_redis.node("node-b")
    centre = broker.connect(up_redis.url, timeout=30, retries=0)
    consumer = stream.Consumer(centre, name="flooded", block_ms=10)
    consumer.ensure_group()
    key = broker.ingest_key()
    first = snapshot("node-a", 2, at=timezone.now() - timedelta(seconds=INTERVAL_S))
    assert stream.in_process([wire.encode_entry(key_a, "node-a", wire.SNAPSHOT,
                                                [wire.encode_snapshot(first), None])]) == [ACCEPTED]

    inflated: list[str] = []
    real_payload = wire.entry_payload

    def payload(entry, *args, **kwargs):
        inflated.append(entry.node)
        return real_payload(entry, *args, **kwargs)

    monkeypatch.setattr(wire, "entry_payload", payload)
    flood = bench_flood.flood(key_b, "node-b", "node-a", key_a.generation, FLOOD, BOMBS,
                              lambda node, at: snapshot(node, 1, at=at))
    refused_by_redis = bench_flood.append_all(agent_b, STREAM, flood)
    # The junk (a quarter of the flood) never reached the stream.
    assert refused_by_redis == FLOOD // 4
    assert centre.xlen(key) == FLOOD + BOMBS + 2 - FLOOD // 4

    nxt = snapshot("node-a", 2)
    broker.append(wire.encode_entry(key_a, "node-a", wire.SNAPSHOT, [wire.encode_snapshot(nxt), None]), agent_a)
    handled = 0
    while step := consumer.step():
        handled += step
    assert Node.objects.filter(name="node-a", collected_at=nxt["collected_at"]).exists()

    # The whole flood was ahead of A's snapshot, and is handled, acknowledged and gone.
    assert handled == len(flood) - refused_by_redis + 1
    assert centre.xlen(key) == 0 and centre.xpending(key, wire.INGEST_GROUP)["pending"] == 0
    node_a = Node.objects.get(name="node-a")
    assert node_a.status != Health.FAIL and node_a.problem == ""
    assert (node_a.refused_total, node_a.refused_last_reason) == (FLOOD // 4, Refusal.BAD_SIGNATURE)
    # B's signed entries past its cap are refused before anything is inflated; of its
    # flood no more than the cap is inflated or stored (its two real snapshots).
    assert inflated.count("node-b") == CAP and inflated.count("node-a") == 1
    node_b = Node.objects.get(name="node-b")
    signed_by_b = 2 + BOMBS + FLOOD // 4
    assert signed_by_b - CAP <= node_b.refused_total <= signed_by_b
    assert DeviceSample.objects.filter(device__node=node_b).count() <= CAP


def test_ups_redis_refuses_an_entry_past_the_wire_bound_or_of_other_fields(up_redis):
    """Redis's proto-max-bulk-len is the wire's body bound: a longer body never reaches
    Redis's memory; and the append function, the one way a node may append, takes an
    entry's five fields and no more: 64 fields of 1 MiB each (each argument within
    Redis's bound) never reach the stream either, nor does a node's own XADD."""
    key = credentials.enroll("node-b")
    agent = up_redis.node("node-b")
    fitting = wire.signed_entry(key, "node-b", wire.SNAPSHOT, b"x" * wire.ENTRY_BODY_MAX)
    broker.append(fitting, agent)
    longer = wire.signed_entry(key, "node-b", wire.SNAPSHOT, b"x" * (wire.ENTRY_BODY_MAX + 1))
    with pytest.raises(redis.RedisError):
        broker.append(longer, agent)
    many = [x for i in range(32) for x in (f"f{i}".encode(), b"x" * (wire.ENTRY_BODY_MAX - 8))]
    with pytest.raises(redis.ResponseError, match="an entry is five fields"):
        agent.fcall(broker.append_function(STREAM), 0, *many)
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.xadd(STREAM, dict(zip(many[::2], many[1::2], strict=True)))
    assert broker.connect(up_redis.url, retries=0).xlen(broker.ingest_key()) == 1


def test_bodies_inflated_and_then_refused_count_against_the_batch_bound(settings):
    """A signed body that inflates to the per-message bound and then is refused (not
    JSON) cost the inflating all the same: a batch of them is cut at the batch bound."""
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 100
    key = credentials.enroll("node-b")
    # Each a body of its own: copies of one would be refused as replays before inflating.
    bombs = [wire.signed_entry(key, "node-b", wire.SNAPSHOT, zlib.compress(b"\0" * (wire.ENTRY_INFLATED_MAX - 1 - i)))
             for i in range(20)]
    outcomes = stream.in_process(bombs)
    per_batch = stream.BATCH_INFLATED_MAX // wire.ENTRY_INFLATED_MAX
    assert outcomes[:per_batch] == [stream.REFUSED] * per_batch
    assert stream.DEFERRED in outcomes[per_batch:per_batch + 1]


def test_junk_is_counted_and_its_reason_logged_once_a_batch_not_once_an_entry(caplog):
    """Entries anyone may append (not even the fields of an entry) cost a counter each,
    not a log line each: a flood of them must not flood the log too."""
    junk = [{b"junk": str(i).encode()} for i in range(500)]
    with caplog.at_level("WARNING", logger="gpufleet.ingest.stream"):
        assert stream.in_process(junk) == [stream.REFUSED] * 500
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert "does not have the fields" in lines[0] and "refused 500 ingest entries of node ''" in lines[1]
