"""A stored batch is acknowledged in one round trip to Redis (ingest.tasks.acknowledge):
each message leaves Redis's index of unacknowledged messages, and neither kombu nor
Celery acknowledges it again; when Redis is gone the messages stay there, to be
delivered again. Real messages on the real broker, received with kombu as the ingest
worker's consumer receives them."""

from __future__ import annotations

import logging
import uuid

import pytest
import redis
from celery.worker.request import Request
from kombu import Consumer, Queue

from gpufleet import wire
from gpufleet.celery import app
from gpufleet.ingest import tasks

pytestmark = pytest.mark.integration

COUNT = 5


@pytest.fixture
def received(broker):
    """COUNT ingest messages on a queue of this test's own, received and not yet
    acknowledged, as the worker holds them: (Celery requests, Redis client)."""
    queue = Queue(f"it-ack-{uuid.uuid4().hex[:8]}")
    with app.connection_for_write(broker.url) as conn, conn.Producer() as producer:
        for i in range(COUNT):
            app.send_task(wire.INGEST_TASK, args=[{"node": f"n{i}"}, None], queue=queue, producer=producer)
    messages = []
    with app.connection_for_read(broker.url) as conn, conn.channel() as channel:
        channel.basic_qos(0, COUNT, False)
        with Consumer(channel, [queue], callbacks=[lambda body, message: messages.append(message)],
                      accept=["json"]):
            while len(messages) < COUNT:
                conn.drain_events(timeout=5)
        requests = [Request(m, on_ack=m.ack_log_error, app=app, task=app.tasks[wire.INGEST_TASK]) for m in messages]
        client = redis.Redis.from_url(broker.url)
        yield requests, client
        client.close()
        channel.queue_delete(queue.name)


def _unacknowledged(client, requests) -> list[bool]:
    return [bool(client.hexists("unacked", r.message.delivery_tag)) for r in requests]


def test_a_stored_batch_leaves_the_index_of_unacknowledged_messages_in_one_round_trip(received, monkeypatch):
    requests, client = received
    assert _unacknowledged(client, requests) == [True] * COUNT
    qos = requests[0].message.channel.qos
    executed = []
    execute = redis.client.Pipeline.execute

    def counted(self, *args, **kwargs):
        executed.append(len(self.command_stack))
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
    tasks.acknowledge(requests)
    monkeypatch.undo()
    assert executed == [2]  # one pipeline: a ZREM and an HDEL of every message's entries
    assert _unacknowledged(client, requests) == [False] * COUNT
    assert not client.zscore("unacked_index", requests[0].message.delivery_tag)
    assert all(r.acknowledged and r.message.acknowledged for r in requests)
    assert qos.can_consume()  # the messages left the channel's prefetch window
    with pytest.raises(requests[0].message.MessageStateError):
        requests[0].message.ack()  # kombu refuses to acknowledge one twice


def test_with_redis_gone_the_batch_stays_unacknowledged_to_be_delivered_again(received, monkeypatch, caplog):
    requests, client = received
    qos = requests[0].message.channel.qos

    def unreachable(self, *args, **kwargs):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(redis.client.Pipeline, "execute", unreachable)
    with caplog.at_level(logging.ERROR, logger=tasks.log.name):
        tasks.acknowledge(requests)
    assert f"could not acknowledge {COUNT} ingest messages" in caplog.text
    monkeypatch.undo()
    assert _unacknowledged(client, requests) == [True] * COUNT
    # Held by nobody now: Redis restores them to the queue after the visibility timeout.
    assert all(r.acknowledged for r in requests)
    assert qos.can_consume()
    for r in requests:  # this test's own messages, cleaned up
        client.hdel("unacked", r.message.delivery_tag)
        client.zrem("unacked_index", r.message.delivery_tag)
