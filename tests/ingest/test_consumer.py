"""The ingest consumer's loop on a redis-server of the test's own: a batch is
acknowledged only after it is stored; what a consumer could not store or acknowledge is
taken again; a dead consumer's entries are taken over after the visibility timeout;
SIGTERM (stop) lets the batch in hand finish; consumers share each node's admission cap."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.db import OperationalError

from gpufleet import wire
from gpufleet.core import broker
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import DeviceSample, Node, Refusal
from gpufleet.ingest import stream
from gpufleet.ingest.services import STALE
from tests.factories import agent_entry, snapshot
from tests.integration.conftest import own_redis  # noqa: F401  (a redis-server of the test's own)

pytestmark = pytest.mark.django_db
STREAM = "test:ingest"


@pytest.fixture
def client(own_redis):  # noqa: F811
    client = broker.connect(own_redis.url, timeout=2, retries=0)
    broker_users.prepare(client, STREAM)
    return client


def _append(client, names: list[str]) -> None:
    for name in names:
        broker.append(agent_entry(snapshot(name, gpus=1)), client)


def _consumer(client, name: str = "c1", **options) -> stream.Consumer:
    return stream.Consumer(client, stream=STREAM, name=name, block_ms=10, **options)


def _pending(client) -> int:
    return client.xpending(broker.ingest_key(STREAM), wire.INGEST_GROUP)["pending"]


@pytest.fixture(autouse=True)
def _stream(settings):
    settings.GPUFLEET_INGEST_STREAM = STREAM


def test_a_batch_is_stored_then_acknowledged_and_deleted(client):
    _append(client, ["a", "b", "c"])
    consumer = _consumer(client)
    assert consumer.step() == 3
    assert set(Node.objects.values_list("name", flat=True)) == {"a", "b", "c"}
    assert client.xlen(broker.ingest_key(STREAM)) == 0 and _pending(client) == 0
    assert broker.stream_status(client, STREAM) == (0, 0)


def test_a_batch_the_database_cannot_take_stays_unacknowledged_and_is_taken_again(client, monkeypatch):
    _append(client, ["a", "b"])
    monkeypatch.setattr(stream.time, "sleep", lambda seconds: None)  # the retries, at once
    monkeypatch.setattr(stream, "close_old_connections", lambda: None)  # the test's own stays open

    def down(snapshots):
        raise OperationalError("connection refused")

    real = stream.ingest_snapshots
    monkeypatch.setattr(stream, "ingest_snapshots", down)
    consumer = _consumer(client)
    with pytest.raises(OperationalError):
        consumer.step()
    assert _pending(client) == 2 and not Node.objects.exists()  # nothing acknowledged unstored
    monkeypatch.setattr(stream, "ingest_snapshots", real)
    consumer._own_pending = True  # as run() does after a database error
    assert consumer.step() == 2
    assert Node.objects.count() == 2 and _pending(client) == 0 and client.xlen(broker.ingest_key(STREAM)) == 0


def test_with_redis_gone_at_the_acknowledgement_the_stored_batch_is_taken_again_as_stale(client, monkeypatch):
    _append(client, ["a"])
    consumer = _consumer(client)
    real = consumer.acknowledge

    def lost(ids):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(consumer, "acknowledge", lost)
    with pytest.raises(redis.ConnectionError):
        consumer.step()
    assert Node.objects.filter(name="a").exists() and _pending(client) == 1
    monkeypatch.setattr(consumer, "acknowledge", real)
    outcomes = []
    consumer.handle = lambda fields: outcomes.extend(stream.ingest_entries(fields)) or outcomes
    consumer._own_pending = True  # as run() does after losing Redis
    assert consumer.step() == 1
    assert outcomes == [STALE] and _pending(client) == 0
    assert DeviceSample.objects.count() == 1  # stored once


def test_a_dead_consumers_entries_are_taken_over_after_the_visibility_timeout(client):
    _append(client, ["a", "b"])
    dead = _consumer(client, "dead")
    dead.ensure_group()
    assert len(dead.read()) == 2  # read, never handled: then killed
    alive = _consumer(client, "alive", claim_idle_s=0.05)
    import time

    time.sleep(0.1)
    assert alive.step() == 2
    assert Node.objects.count() == 2 and _pending(client) == 0


def _gone_pid() -> int:
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_entries_of_a_consumer_of_this_host_that_no_longer_runs_are_taken_at_once(client):
    # As after `up` restarted: its killed consumer had been handed entries (a blocked read
    # that the backlog answered); waiting out the visibility timeout would hold them 300 s.
    _append(client, ["a", "b"])
    host = socket.gethostname()
    dead = _consumer(client, f"{host}:{_gone_pid()}")
    dead.ensure_group()
    assert len(dead.read()) == 2
    assert _consumer(client, f"{host}:{os.getpid()}").step() == 2
    assert Node.objects.count() == 2 and _pending(client) == 0


def test_the_entries_of_a_running_consumer_or_one_of_another_host_wait_the_visibility_timeout(client):
    _append(client, ["a", "b"])
    running = _consumer(client, f"{socket.gethostname()}:{os.getppid()}")
    running.ensure_group()
    assert len(running.read()) == 2
    _append(client, ["c"])
    elsewhere = _consumer(client, f"another-host.example:{_gone_pid()}")
    assert len(elsewhere.read()) == 1
    assert _consumer(client, "taker").step() == 0
    assert _pending(client) == 3 and not Node.objects.exists()


def test_stop_lets_the_batch_in_hand_finish_and_run_return(client):
    _append(client, ["a", "b"])
    consumer = _consumer(client)
    real = stream.ingest_entries

    def handle(fields):
        consumer.stop()  # SIGTERM while the batch is being stored
        return real(fields)

    consumer.handle = handle
    consumer.run()
    assert Node.objects.count() == 2 and _pending(client) == 0


def test_entries_the_stream_trimmed_unstored_are_counted(client, settings):
    settings.GPUFLEET_INGEST_STREAM_MAXLEN = 1
    for name in ("a", "b", "c"):
        client.xadd(broker.ingest_key(STREAM), agent_entry(snapshot(name, gpus=1)), maxlen=1, approximate=False)
    assert broker.stream_status(client, STREAM) == (1, 2)
    assert _consumer(client).step() == 1
    assert broker.stream_status(client, STREAM) == (0, 2)


def test_consumers_together_accept_no_more_of_a_node_than_its_cap_per_interval(client, settings):
    # One interval for the whole test: the cap holds across consumers, not per process.
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 4
    settings.GPUFLEET_COLLECT_INTERVAL = 10_000_000.0
    key, start = credentials.enroll("flooder"), datetime.now(UTC)
    for second in range(40):
        broker.append(agent_entry(snapshot("flooder", gpus=1, at=start + timedelta(seconds=second)), key=key), client)
    outcomes: list[str] = []
    consumers = [_consumer(client, name, batch=5) for name in ("c1", "c2", "c3")]
    for consumer in consumers:
        handle = consumer.handle
        consumer.handle = lambda fields, handle=handle: outcomes.extend(handle(fields)) or outcomes[-len(fields):]
    while len(outcomes) < 40:
        for consumer in consumers:
            consumer.step()
    assert len(outcomes) == 40 and sum(outcome != stream.REFUSED for outcome in outcomes) == 4
    # The rest refused as over the cap (and those of the four that one batch made stale as replays).
    node = Node.objects.get(name="flooder")
    assert (node.refused_total, node.refused_last_reason) == (36 + outcomes.count(STALE), Refusal.OVER_CAP)


def test_a_consumer_started_on_a_full_redis_reads_on_and_frees_it(client):
    # maxmemory reached (noeviction, Redis's default policy): Redis refuses the writes that
    # would take more memory, the function's and the group's loading included; reading,
    # acknowledging and deleting, which free it, go on.
    _append(client, ["a", "b"])
    _consumer(client, "first").ensure_group()
    client.config_set("maxmemory", max(1, client.info("memory")["used_memory"] // 2))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("x", "y")
    consumer = _consumer(client, "after-a-restart")
    assert consumer.step() == 2
    assert Node.objects.count() == 2 and client.xlen(broker.ingest_key(STREAM)) == 0


def test_replays_of_one_of_a_nodes_entries_are_refused_as_replays_without_spending_its_cap(client, settings):
    # One interval for the whole test: every grant counts against the same cap of 4.
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 4
    settings.GPUFLEET_COLLECT_INTERVAL = 10_000_000.0
    key, start = credentials.enroll("alpha"), datetime.now(UTC) - timedelta(hours=1)
    genuine = [agent_entry(snapshot("alpha", gpus=1, at=start + timedelta(seconds=30 * i)), key=key)
               for i in range(4)]
    consumer = _consumer(client, batch=5)
    outcomes: list[str] = []
    handle = consumer.handle
    consumer.handle = lambda fields: outcomes.extend(handle(fields)) or outcomes[-len(fields):]
    broker.append(genuine[0], client)
    consumer.step()
    # Another broker user appends alpha's first entry again and again, between alpha's own.
    for entry in genuine[1:]:
        for _ in range(20):
            broker.append(genuine[0], client)
        broker.append(entry, client)
    while consumer.step():
        pass
    assert outcomes.count("accepted") == 4 and len(outcomes) == 64  # every genuine snapshot stored
    node = Node.objects.get(name="alpha")
    assert node.collected_at == start + timedelta(seconds=90)
    assert (node.refused_total, node.refused_last_reason) == (60, Refusal.REPLAY)
    # The replays took none of the node's grants: its four snapshots took all of them.
    assert client.llen(f"{broker.ingest_key(STREAM)}:admitted:alpha") == 4
