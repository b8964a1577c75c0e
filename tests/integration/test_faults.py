"""Faults on the way from agent to database, with real processes: Redis killed
and started again under load, ingest consumers killed at random instants, PostgreSQL
restarted mid-transaction. Each test runs its own redis-server (never the shared one)
and real `manage.py ingest` consumers and `celery worker`s."""

from __future__ import annotations

import random
import signal
import time

import pytest

from gpufleet import wire
from gpufleet.core import broker
from gpufleet.fleet import credentials
from gpufleet.fleet.models import DeviceSample, Node
from tests.factories import snapshot
from tests.integration.workers import (
    agent_key_env,
    agent_process,
    database_url_for_workers,
    ingest_consumer,
    send_snapshot,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

def _central(own_redis, **extra) -> dict[str, str]:
    return {"CELERY_BROKER_URL": own_redis.url, "DATABASE_URL": database_url_for_workers(),
            "GPUFLEET_NODE_NAME": "central", **extra}


def _send(names: list[str], gpus: int = 2) -> list[str]:
    """Append one snapshot per name; the names whose entry Redis took."""
    sent = []
    for name in names:
        try:
            send_snapshot(snapshot(name, gpus=gpus))
        except Exception:  # Redis is down: this one was never accepted
            continue
        sent.append(name)
    return sent


def _stored(names) -> set[str]:
    return set(Node.objects.filter(name__in=list(names)).values_list("name", flat=True))


def test_redis_killed_and_started_again_under_load_loses_no_accepted_snapshot(own_redis, fake_host, tmp_path):
    agent_env = {**_central(own_redis), **fake_host.env(), "GPUFLEET_NODE_NAME": "faulty-1",
                 "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_COLLECT_INTERVAL": "1", **agent_key_env("faulty-1")}
    with ingest_consumer(_central(own_redis, GPUFLEET_BROKER_VISIBILITY_TIMEOUT="5")) as ingest, \
         agent_process(agent_env) as agent:
        workers = (ingest, agent)
        sent = _send([f"before-{i:03}" for i in range(150)])
        own_redis.kill()  # mid-stream: some are stored, some wait in Redis's append-only file
        lost_window = _send([f"during-{i:03}" for i in range(5)])
        assert lost_window == []  # nothing was accepted while Redis was down
        time.sleep(2)
        own_redis.start()
        sent += _send([f"after-{i:03}" for i in range(50)])
        # An entry is pending from the instant Redis hands it out (append-only, synced):
        # whatever the consumer held when Redis died is taken again, none is missing.
        wait_for(lambda: _stored(sent) == set(sent), 60, "every accepted snapshot to be stored", workers)
        assert any("lost Redis" in line for line in ingest.lines), ingest.output
        # The agent reconnects by itself and reports again within an interval or two.
        seen = wait_for(lambda: Node.objects.filter(name="faulty-1").values_list("collected_at", flat=True).first(),
                        15, "the agent after the outage", workers)
        wait_for(lambda: Node.objects.get(name="faulty-1").collected_at > seen, 15, "the agent's next snapshot",
                 workers)
        assert ingest.alive() and agent.alive()
        assert not any("Unrecoverable error" in line for line in ingest.lines + agent.lines)
    assert len(sent) == 200
    stored = _stored(sent)
    assert DeviceSample.objects.filter(device__node__name__in=stored).count() == 2 * len(stored)  # each once


KILLS = 8


def test_consumers_killed_at_random_instants_during_a_backlog_lose_nothing_and_store_nothing_twice(own_redis):
    """kill -9 of a consumer, KILLS times, each at a random instant while a backlog is
    being stored (mid-read, mid-transaction, between the commit and the XACK): the
    entries it held are taken over by the next one (XAUTOCLAIM after the visibility
    timeout), every snapshot is stored, and none twice (one sample of its GPU)."""
    client = own_redis.client()
    stream = broker.ingest_key()
    names: list[str] = []

    def append(count: int) -> None:
        batch = [f"killed-{i:05}" for i in range(len(names), len(names) + count)]
        keys = credentials.enroll_many(batch)
        with client.pipeline(transaction=False) as pipe:
            for name in batch:
                fields = wire.encode_entry(keys[name], name, wire.SNAPSHOT, [wire.encode_snapshot(snapshot(name, 1)), None])
                broker.append(fields, pipe)
            pipe.execute()
        names.extend(batch)

    append(3000)
    # Small batches: more of the kills land inside one; a short timeout: taken over soon.
    env = _central(own_redis, GPUFLEET_BROKER_VISIBILITY_TIMEOUT="2", GPUFLEET_INGEST_BATCH="20")
    rng = random.Random(27)
    waiting_at_kills = []
    for kill in range(KILLS):
        # A backlog at every kill, however fast this machine stores: topped up between kills.
        if client.xlen(stream) < 1000:
            append(1000)
        with ingest_consumer(env, f"doomed-{kill}") as doomed:
            time.sleep(rng.uniform(0.05, 0.6))
            waiting_at_kills.append(client.xlen(stream))
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait()
    assert min(waiting_at_kills) > 0, waiting_at_kills

    def drained() -> bool:
        return client.xlen(stream) == 0 and client.xpending(stream, wire.INGEST_GROUP)["pending"] == 0

    with ingest_consumer(env, "last") as last:
        wait_for(lambda: _stored(names) == set(names) and drained(), 120, "every snapshot, the held ones too", (last,))
    per_node = DeviceSample.objects.filter(device__node__name__in=names).values_list("device__node__name", flat=True)
    assert len(per_node) == len(names) and set(per_node) == set(names)  # each once: none lost, none twice


def test_postgresql_restarted_under_load_stores_every_snapshot_whole(own_redis, own_postgres):
    """The database goes away mid-transaction (an immediate stop: connections cut) and
    comes back a few seconds later: the consumer retries with backoff, stays up,
    acknowledges nothing it did not store, and every snapshot ends up stored exactly
    once, none of them in part."""
    env = _central(own_redis, DATABASE_URL=own_postgres.url, GPUFLEET_BROKER_VISIBILITY_TIMEOUT="30")
    # Enough that the consumer is still storing when the database stops: the first batch
    # (up to GPUFLEET_INGEST_BATCH) is what the test waits for.
    names = [f"pg-restart-{i:04}" for i in range(1200)]
    # Enrolled in the cluster the worker uses (generation 1, as _send signs with).
    own_postgres.execute("INSERT INTO fleet_nodecredential (name, generation, issued_at) "
                         "SELECT unnest(%s::text[]), 1, now()", [names])
    assert _send(names, gpus=8) == names

    def stored() -> int:
        return own_postgres.query("SELECT count(*) FROM fleet_node WHERE name = ANY(%s)", [names])[0][0]

    with ingest_consumer(env) as worker:
        wait_for(lambda: stored() >= 30, 60, "the first snapshots", (worker,))
        own_postgres.stop("immediate")
        time.sleep(3)
        own_postgres.start()
        wait_for(lambda: stored() == len(names), 120, "every snapshot after the restart", (worker,))
        assert worker.alive()
        retried = [line for line in worker.lines if "database unreachable" in line]
        assert retried, f"the consumer never met the outage: the test proves nothing\n{worker.output}"
        wait_for(lambda: own_redis.client().xlen(broker.ingest_key()) == 0, 10, "nothing left unstored",
                 (worker,))
    # Whole: every node has its 8 GPUs and one sample of each, and the same findings as the others.
    rows = own_postgres.query(
        """SELECT n.name, count(DISTINCT d.id), count(s.*),
                  (SELECT count(*) FROM fleet_finding f WHERE f.node_id = n.id)
           FROM fleet_node n JOIN fleet_device d ON d.node_id = n.id
           LEFT JOIN fleet_devicesample s ON s.device_id = d.id
           WHERE n.name = ANY(%s) GROUP BY n.id, n.name""",
        [names],
    )
    assert len(rows) == len(names)
    assert {(devices, samples) for _, devices, samples, _ in rows} == {(8, 8)}
    assert len({findings for *_, findings in rows}) == 1
