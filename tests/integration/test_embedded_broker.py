"""The embedded file broker (fsq://) under load: several producer and consumer
processes at once. kombu's stock filesystem transport loses messages and kills
consumers on half-written files in this test; ours must deliver every message
exactly once."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest

import gpufleet.broker  # noqa: F401  registers fsq://

PRODUCERS, CONSUMERS, PER_PRODUCER = 3, 2, 700


def _connection(folder: str):
    from kombu import Connection

    return Connection("fsq://", transport_options={"folder": folder})


def _produce(folder: str, producer: int) -> None:
    from kombu import Exchange, Queue

    queue = Queue("work", Exchange("work"), routing_key="work")
    with _connection(folder) as conn:
        publish = conn.Producer().publish
        for n in range(PER_PRODUCER):
            publish({"id": f"{producer}-{n}", "pad": "x" * (n % 2000)}, exchange=queue.exchange,
                    routing_key="work", declare=[queue], serializer="json")


def _consume(folder: str, out: str, expected: int) -> None:
    from kombu import Exchange, Queue

    queue = Queue("work", Exchange("work"), routing_key="work")
    seen = []
    with _connection(folder) as conn:
        simple = conn.SimpleQueue(queue)
        idle = 0
        while idle < 30 and len(seen) < expected:
            try:
                message = simple.get(timeout=0.1)
            except simple.Empty:
                idle += 1
                continue
            idle = 0
            seen.append(message.payload["id"])
            message.ack()
        simple.close()
    Path(out).write_text(json.dumps(seen))


@pytest.mark.integration
def test_every_message_arrives_exactly_once_under_concurrent_load(tmp_path):
    folder = str(tmp_path / "broker")
    total = PRODUCERS * PER_PRODUCER
    ctx = mp.get_context("spawn")
    consumers = [ctx.Process(target=_consume, args=(folder, str(tmp_path / f"c{i}.json"), total))
                 for i in range(CONSUMERS)]
    producers = [ctx.Process(target=_produce, args=(folder, p)) for p in range(PRODUCERS)]
    for proc in consumers + producers:
        proc.start()
    for proc in producers + consumers:
        proc.join(120)

    assert [p.exitcode for p in producers + consumers] == [0] * (PRODUCERS + CONSUMERS)
    received = [mid for i in range(CONSUMERS) for mid in json.loads((tmp_path / f"c{i}.json").read_text())]
    assert len(received) == total, f"{total - len(set(received))} lost, {len(received) - len(set(received))} twice"
    assert set(received) == {f"{p}-{n}" for p in range(PRODUCERS) for n in range(PER_PRODUCER)}
    assert all(len(json.loads((tmp_path / f"c{i}.json").read_text())) > 0 for i in range(CONSUMERS))
    assert os.listdir(Path(folder) / "queue") == []
    assert os.listdir(Path(folder) / "tmp") == []
