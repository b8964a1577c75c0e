"""The ingest stream across restarts of a Redis run as `up` runs it (append-only, users
from an aclfile, no default user): what was queued is stored once Redis is back, and an
ERROR about trimmed entries is logged only when entries were trimmed unstored."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet import wire
from gpufleet.core import broker
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import Node
from gpufleet.ingest import stream
from tests.acl_redis import running
from tests.factories import agent_entry, snapshot

pytestmark = pytest.mark.django_db
STREAM = "test:ingest"
NODES = 12


@pytest.fixture
def server(settings):
    settings.GPUFLEET_INGEST_STREAM = STREAM
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 100
    yield from running(as_up=True)


def _client(server):
    client = broker.connect(server.url(), timeout=2)
    broker_users.prepare(client, STREAM)
    return client


def _append(client, keys: dict[str, bytes], second: int, nodes=None) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=second)
    for name in nodes or keys:
        broker.append(agent_entry(snapshot(name, gpus=1, at=at), key=keys[name]), client)


def _consumer(client, name: str, **options) -> stream.Consumer:
    return stream.Consumer(client, stream=STREAM, name=name, block_ms=10, **options)


def _drain(consumer: stream.Consumer) -> None:
    key = broker.ingest_key(STREAM)
    for _ in range(200):
        consumer.step()
        if not consumer.client.xlen(key) and not consumer.client.xpending(key, wire.INGEST_GROUP)["pending"]:
            return
    raise AssertionError("the stream was not drained")


def _trim_errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and "trimmed" in r.getMessage()]


@pytest.mark.parametrize("restart", ["stop", "kill"])
def test_entries_queued_when_redis_restarts_are_all_stored_and_nothing_is_called_trimmed(server, caplog, restart):
    client = _client(server)
    keys = {f"n{i:02d}": credentials.enroll(f"n{i:02d}") for i in range(NODES)}
    consumer = _consumer(client, "c1", batch=5, claim_idle_s=0.05)
    # Running for a while: batches of every size read, stored, acknowledged and deleted
    # (one entry at a time too, as a consumer that keeps up reads them).
    for second in range(4):
        for names in (list(keys)[:1], list(keys)[1:2], list(keys)[2:]):
            _append(client, keys, second, names)
            _drain(consumer)
    # Then a backlog, half of it taken, and a consumer that read a batch and died.
    _append(client, keys, 10)
    consumer.step()
    assert len(_consumer(client, "died", batch=3).read()) == 3
    caplog.clear()
    caplog.set_level(logging.INFO, logger="gpufleet.ingest.stream")
    getattr(server, restart)()
    server.start()
    _drain(consumer)
    assert _trim_errors(caplog) == []
    stored = {name: Node.objects.get(name=name).collected_at for name in keys}
    assert set(stored.values()) == {datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)}, stored
    assert broker.stream_status(client, STREAM) == (0, 0)
    assert "CRITICAL" not in server.log.read_text()


def test_entries_trimmed_while_the_consumers_are_stopped_are_logged_once_with_their_true_count(server, caplog):
    client = _client(server)
    keys = {f"n{i:02d}": credentials.enroll(f"n{i:02d}") for i in range(NODES)}
    key = broker.ingest_key(STREAM)
    _append(client, keys, 0)
    _drain(_consumer(client, "before", batch=5, claim_idle_s=0.05))
    # A consumer read 4 and was stopped, the other too; then the stream outgrew its MAXLEN
    # (an exact trim here: the append function trims about MAXLEN, by whole nodes of entries).
    _append(client, keys, 1)
    assert len(_consumer(client, "stopped", batch=4).read()) == 4
    for name in keys:
        client.xadd(key, agent_entry(snapshot(name, gpus=1, at=datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)),
                                     key=keys[name]), maxlen=5, approximate=False)
    caplog.clear()
    caplog.set_level(logging.INFO, logger="gpufleet.ingest.stream")
    started = [_consumer(client, name, batch=5, claim_idle_s=0.05) for name in ("after", "beside")]
    for consumer in started:
        _drain(consumer)
    # Of the 24 entries appended, the last 5 were left: 19 trimmed unstored, 4 of them pending.
    assert _trim_errors(caplog) == [
        "19 ingest entries were trimmed from the stream before they were stored: raise "
        "GPUFLEET_INGEST_STREAM_MAXLEN or add consumers",
    ]
    assert "4 of the entries trimmed from the stream unstored had been handed to a consumer" in caplog.messages
    assert broker.stream_status(client, STREAM) == (0, 19)
    assert Node.objects.filter(collected_at=datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)).count() == 5
