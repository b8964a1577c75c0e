"""The real loop: agent worker (with its beat) → ingest stream → ingest consumer →
database, and "diagnose now" from the site back to the agent, on Redis. Workers are
real processes (`celery worker`, `manage.py ingest`) on a fake GPU host."""

from __future__ import annotations

import pytest

from gpufleet.fleet.models import Node
from gpufleet.jobs.models import Job, JobStatus
from gpufleet.jobs.services import request_diagnosis
from tests.integration.workers import (
    agent_key_env,
    agent_process,
    celery_worker,
    database_url_for_workers,
    ingest_consumer,
    send_snapshot,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

INTERVAL = "1"


def _env(broker, node: str, fake_host=None) -> dict[str, str]:
    env = {**broker.env(), "DATABASE_URL": database_url_for_workers(), "GPUFLEET_NODE_NAME": node,
           "GPUFLEET_COLLECT_INTERVAL": INTERVAL}
    if fake_host is not None:
        env.update(fake_host.env(), **agent_key_env(node))
    return env


def test_agent_snapshots_reach_the_database_and_diagnose_now_comes_back(broker, fake_host, node_name, admin_user, tmp_path):
    central_env = _env(broker, "central")
    agent_env = _env(broker, node_name, fake_host)
    with celery_worker("housekeeping", "housekeeping", central_env, beat_file=tmp_path / "beat-central") as beat, \
         ingest_consumer(central_env) as ingest, \
         agent_process(agent_env) as agent:
        workers = (beat, ingest, agent)
        node = wait_for(lambda: Node.objects.filter(name=node_name, gpu_count=8).first(), 30,
                        "the agent's first snapshot", workers)
        assert node.attach == "cdi" and node.findings.filter(code="driver", status="ok").exists()

        # Beat keeps collecting: a later snapshot replaces the first.
        first = node.collected_at
        wait_for(lambda: Node.objects.get(pk=node.pk).collected_at > first, 15, "a second scheduled snapshot", workers)

        job = request_diagnosis(node, admin_user)
        done = wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.DONE).first(), 20,
                        "the diagnose-now job", workers)
        assert done.started_at is not None and done.finished_at >= done.started_at

    # Agent gone: the central beat marks the node offline after 3 missed intervals.
    with celery_worker("housekeeping", "housekeeping", central_env, beat_file=tmp_path / "beat-central") as beat:
        wait_for(lambda: Node.objects.get(pk=node.pk).offline, 20, "the node to go offline", (beat,))


def test_a_malformed_snapshot_on_the_stream_is_rejected_and_the_consumer_goes_on(broker, node_name):
    from gpufleet.core import broker as redis_broker
    from gpufleet.fleet import credentials
    from tests.factories import agent_entry, snapshot

    credentials.enroll(f"{node_name}-other")  # enrolled before: the consumer knows it at once
    with ingest_consumer(_env(broker, "central")) as ingest:
        bad = snapshot(node_name, gpus=2)
        bad["devices"][0]["index"] = "zero"
        send_snapshot(bad)
        send_snapshot("not a snapshot", node=node_name)
        # Forged, and signed by another node: refused before anything is stored.
        forged = {**agent_entry(snapshot(node_name, gpus=4)), b"sig": b"0" * 64}
        send_snapshot(snapshot(node_name, gpus=6), node=f"{node_name}-other")
        redis_broker.append(forged)
        # Not even an entry: the append function refuses it, and so would a consumer.
        redis_broker.client().xadd(redis_broker.ingest_key(), {b"junk": b"1"})
        send_snapshot(snapshot(node_name, gpus=2))
        node = wait_for(lambda: Node.objects.filter(name=node_name, gpu_count=2).first(), 20, "the good snapshot",
                        (ingest,))
        assert node.devices.count() == 2  # nothing of the bad ones was written
        wait_for(lambda: sum("rejected snapshot" in line for line in ingest.lines) >= 2, 10,
                 "both rejections in the consumer's log", (ingest,))
        refused = [line for line in ingest.lines if "refused" in line]
        assert any(f"node '{node_name}-other': a snapshot of node '{node_name}'" in line for line in refused), \
            ingest.output
        assert any("bad-signature" in line for line in refused) and any("malformed" in line for line in refused)
        assert ingest.alive()


def test_an_entry_that_would_inflate_past_the_bound_is_refused_and_the_consumer_goes_on(broker, node_name):
    """Entries travel compressed; one whose body inflates past the bound is refused as
    too large (counted on its node) and the consumer goes on."""
    import zlib

    from gpufleet import wire
    from gpufleet.core import broker as redis_broker
    from gpufleet.fleet import credentials
    from tests.factories import snapshot

    key = credentials.enroll(f"{node_name}-bomb")
    body = zlib.compress(b"[" + b" " * (wire.ENTRY_INFLATED_MAX + 10) + b"]")
    redis_broker.append(wire.signed_entry(key, f"{node_name}-bomb", wire.SNAPSHOT, body))
    send_snapshot(snapshot(node_name, gpus=8))
    with ingest_consumer(_env(broker, "central")) as ingest:
        wait_for(lambda: Node.objects.filter(name=node_name, gpu_count=8).exists(), 20, "the good snapshot", (ingest,))
        wait_for(lambda: any("inflates to more than" in line for line in ingest.lines) or None, 10,
                 "the oversized entry in the consumer's log", (ingest,))
        assert not Node.objects.filter(name=f"{node_name}-bomb").exists()
        assert ingest.alive()


def test_a_backlog_short_of_full_batches_and_a_lone_snapshot_are_stored_without_waiting_for_more(broker, node_name):
    """The last part of a backlog (half a batch) and then a lone snapshot to a quiet
    consumer are stored within seconds, not held for a batch."""
    from tests.factories import snapshot

    backlog = [f"{node_name}-{i:03}" for i in range(250)]  # two full batches and half of one
    for name in backlog:
        send_snapshot(snapshot(name, gpus=1))
    env = {**_env(broker, "central"), "GPUFLEET_INGEST_BATCH": "100"}
    stored = Node.objects.filter(name__in=backlog)
    with ingest_consumer(env) as ingest:
        wait_for(lambda: stored.count() == len(backlog), 20, "the whole backlog", (ingest,))
        send_snapshot(snapshot(node_name, gpus=2))
        node = wait_for(lambda: Node.objects.filter(name=node_name).first(), 10, "the lone snapshot", (ingest,))
    assert node.gpu_count == 2
