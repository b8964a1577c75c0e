"""An entry whose handling raises something unexpected (a bug, not Redis or the database
gone) never stops a consumer: its batch is handled again one entry at a time, so the
others are stored; the entry that fails twice goes to the dead-letter stream, with its
error and its node, is acknowledged, counted in /metrics, raised as an event of the
site, listed by `manage.py ingest --dead-letters`, and stored after a fix with
`manage.py ingest --replay-dead-letter ID`."""

from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from gpufleet import wire
from gpufleet.api.metrics import render
from gpufleet.core import broker
from gpufleet.events.models import Event, Kind
from gpufleet.fleet import broker_users
from gpufleet.fleet.models import Node
from gpufleet.ingest import stream
from tests.factories import agent_entry, snapshot
from tests.integration.conftest import own_redis  # noqa: F401  (a redis-server of the test's own)

pytestmark = pytest.mark.django_db(transaction=True)  # the consumers' threads see what the test wrote
STREAM = "test:ingest"
GOOD = [f"node-{i:02d}" for i in range(12)]


@pytest.fixture(autouse=True)
def _stream(settings, own_redis):  # noqa: F811
    settings.GPUFLEET_INGEST_STREAM = STREAM
    settings.CELERY_BROKER_URL = own_redis.url
    broker_users.prepare(own_redis.client(), STREAM)


def _running(url: str, name: str, failures: list) -> tuple[stream.Consumer, threading.Thread]:
    consumer = stream.Consumer(broker.connect(url, timeout=2, retries=0), stream=STREAM, name=name, batch=4,
                               block_ms=50)

    def run():
        try:
            consumer.run()
        except BaseException as exc:  # what ended the consumer, for the test to say
            failures.append(f"{name}: {exc!r}")
            raise
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return consumer, thread


def _wait_for(predicate, what: str, threads, failures) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if predicate():
            return
        if failures or not all(t.is_alive() for t in threads):
            raise AssertionError(f"a consumer stopped while waiting for {what}: {failures}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_an_entry_the_store_raises_on_is_set_aside_and_two_consumers_store_every_other(own_redis, monkeypatch):  # noqa: F811
    client = own_redis.client()
    for i, name in enumerate(GOOD):
        broker.append(agent_entry(snapshot(name, gpus=1)), client)
        if i == 5:
            broker.append(agent_entry(snapshot("poison", gpus=1)), client)
    real = stream.ingest_snapshots

    def store(snapshots):
        if any(getattr(s, "node", None) == "poison" for s in snapshots):
            raise KeyError("a bug in the store")
        return real(snapshots)

    monkeypatch.setattr(stream, "ingest_snapshots", store)
    failures: list[str] = []
    running = [_running(own_redis.url, name, failures) for name in ("c1", "c2")]
    threads = [thread for _, thread in running]
    key = broker.ingest_key(STREAM)
    try:
        _wait_for(lambda: Node.objects.filter(name__in=GOOD).count() == len(GOOD)
                  and client.xlen(stream.dead_letter_key(key)) == 1
                  and client.xpending(key, wire.INGEST_GROUP)["pending"] == 0,
                  "every good snapshot stored and the bad entry set aside", threads, failures)
        assert all(thread.is_alive() for thread in threads) and failures == []
    finally:
        for consumer, _ in running:
            consumer.stop()
        for thread in threads:
            thread.join(timeout=30)
    assert not Node.objects.filter(name="poison").exists() and client.xlen(key) == 0

    [(letter_id, fields)] = client.xrange(stream.dead_letter_key(key))
    assert fields[b"node"] == b"poison" and b"KeyError: 'a bug in the store'" in fields[b"error"]
    counted = [s.value for family in text_string_to_metric_families(render().decode()) for s in family.samples
               if s.name == "gpufleet_ingest_dead_letters_total"]
    assert counted and counted[0] >= 1
    event = Event.objects.get(kind=Kind.INGEST_DEAD_LETTER)
    assert event.node_id is None and "poison" in event.message and "--dead-letters" in event.message

    listed = StringIO()
    call_command("ingest", "--dead-letters", stdout=listed)
    assert letter_id.decode() in listed.getvalue() and "poison" in listed.getvalue()
    assert "KeyError: 'a bug in the store'" in listed.getvalue()

    # The bug fixed: the entry replayed is stored, and leaves the dead letters.
    monkeypatch.setattr(stream, "ingest_snapshots", real)
    replayed = StringIO()
    call_command("ingest", "--replay-dead-letter", letter_id.decode(), stdout=replayed)
    assert "poison" in replayed.getvalue()
    assert client.xlen(stream.dead_letter_key(key)) == 0
    consumer = stream.Consumer(own_redis.client(), stream=STREAM, name="after", block_ms=10)
    assert consumer.step() == 1
    assert Node.objects.filter(name="poison").exists()


def test_replaying_a_dead_letter_that_is_not_there_says_so(own_redis):  # noqa: F811
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no dead letter 1-1"):
        call_command("ingest", "--replay-dead-letter", "1-1")
