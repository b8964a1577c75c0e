"""The real loop: agent worker (with its beat) → broker → ingest worker → database,
and "diagnose now" from the site back to the agent, on Redis. Workers are real
`celery worker` processes on a fake GPU host."""

from __future__ import annotations

import pytest

from gpufleet.fleet.models import Node
from gpufleet.jobs.models import Job, JobStatus
from gpufleet.jobs.services import request_diagnosis
from tests.integration.workers import agent_key_env, celery_worker, database_url_for_workers, send_snapshot, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

INTERVAL = "1"


def _env(broker, role: str, node: str, fake_host=None) -> dict[str, str]:
    env = {**broker.env(), "DATABASE_URL": database_url_for_workers(), "GPUFLEET_ROLE": role,
           "GPUFLEET_NODE_NAME": node, "GPUFLEET_COLLECT_INTERVAL": INTERVAL}
    if fake_host is not None:
        env.update(fake_host.env(), **agent_key_env(node))
    return env


def test_agent_snapshots_reach_the_database_and_diagnose_now_comes_back(broker, fake_host, node_name, admin_user, tmp_path):
    central_env = _env(broker, "central", "central")
    agent_env = _env(broker, "agent", node_name, fake_host)
    with celery_worker("ingest", "ingest,housekeeping", central_env, beat_file=tmp_path / "beat-central") as ingest, \
         celery_worker("agent", f"node.{node_name}", agent_env, beat_file=tmp_path / "beat-agent") as agent:
        workers = (ingest, agent)
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
    with celery_worker("ingest", "ingest,housekeeping", central_env, beat_file=tmp_path / "beat-central") as ingest:
        wait_for(lambda: Node.objects.get(pk=node.pk).offline, 20, "the node to go offline", (ingest,))


def test_a_malformed_snapshot_through_the_broker_is_rejected_and_the_worker_goes_on(broker, node_name, tmp_path):
    from gpufleet import wire
    from gpufleet.celery import app
    from tests.factories import snapshot

    with celery_worker("ingest", "ingest", _env(broker, "central", "central")) as ingest:
        bad = snapshot(node_name, gpus=2)
        bad["devices"][0]["index"] = "zero"
        send_snapshot(bad)
        send_snapshot("not a snapshot", node=node_name)
        # Unsigned, and signed by another node: refused before anything is read.
        app.send_task(wire.INGEST_TASK, args=[snapshot(node_name, gpus=4), None], queue=wire.INGEST_QUEUE)
        send_snapshot(snapshot(node_name, gpus=6), node=f"{node_name}-other")
        send_snapshot(snapshot(node_name, gpus=2))
        node = wait_for(lambda: Node.objects.filter(name=node_name).first(), 20, "the good snapshot", (ingest,))
        assert node.gpu_count == 2
        assert node.devices.count() == 2  # nothing of the bad ones was written
        wait_for(lambda: sum("rejected snapshot" in line for line in ingest.lines) >= 2, 10,
                 "both rejections in the worker log", (ingest,))
        refused = [line for line in ingest.lines if "refused a snapshot" in line]
        assert any("the message is not signed" in line for line in refused), ingest.output
        assert any(f"node '{node_name}-other' signed a snapshot of another node" in line for line in refused)
        assert ingest.alive()


def test_snapshots_travel_compressed_and_plain_ones_from_older_agents_still_store(broker, node_name):
    """Agents compress what they send (a quarter of the bytes in the broker); an agent of
    an earlier release sends plain messages, which the worker takes as before. A message
    that would inflate past the bound is logged and dropped, and the worker goes on."""
    import json

    import redis
    from celery import Celery

    from gpufleet import wire
    from gpufleet.celery import INFLATED_MAX_BYTES
    from tests.factories import agent_auth, snapshot

    queue = redis.Redis.from_url(broker.url)
    bomb = {"node": f"{node_name}-bomb", "pad": "0" * INFLATED_MAX_BYTES}
    send_snapshot(bomb)
    current = snapshot(node_name, gpus=8)
    send_snapshot(current)
    sent = queue.lindex(wire.INGEST_QUEUE, 0)  # the newest: kombu pushes on the left
    assert json.loads(sent)["headers"]["compression"] == "application/x-gzip"
    assert len(sent) < len(json.dumps(current)) / 2

    older = Celery("older-agent", broker=broker.url, set_as_current=False)
    older.conf.broker_transport_options = broker.transport_options
    plain = snapshot(f"{node_name}-older", gpus=2)
    args = [plain, None]
    older.send_task(wire.INGEST_TASK, args=args, kwargs={"auth": agent_auth(plain["node"], wire.INGEST_TASK, args)},
                    queue=wire.INGEST_QUEUE)
    assert "compression" not in json.loads(queue.lindex(wire.INGEST_QUEUE, 0))["headers"]
    older.close()

    with celery_worker("ingest", "ingest", _env(broker, "central", "central")) as ingest:
        stored = wait_for(lambda: Node.objects.filter(name__in=[node_name, plain["node"]]).count() == 2 or None, 20,
                          "the compressed and the plain snapshot", (ingest,))
        assert stored
        assert Node.objects.get(name=node_name).gpu_count == 8
        assert Node.objects.get(name=plain["node"]).gpu_count == 2
        wait_for(lambda: any("inflates to more than" in line for line in ingest.lines) or None, 10,
                 "the oversized message in the worker log", (ingest,))
        assert not Node.objects.filter(name=bomb["node"]).exists()
        assert ingest.alive()
    queue.close()


def test_a_backlog_short_of_full_batches_and_a_lone_snapshot_are_stored_without_waiting_for_more(broker, node_name):
    """The last part of a backlog (half a batch) and then a lone snapshot to a quiet worker
    are handed to the pool by its timer: stored within seconds, not held for a batch."""
    from tests.factories import snapshot

    backlog = [f"{node_name}-{i:03}" for i in range(250)]  # two full batches and half of one
    for name in backlog:
        send_snapshot(snapshot(name, gpus=1))
    env = {**_env(broker, "central", "central"), "GPUFLEET_INGEST_BATCH": "100"}
    stored = Node.objects.filter(name__in=backlog)
    with celery_worker("ingest", "ingest", env) as ingest:
        wait_for(lambda: stored.count() == len(backlog), 20, "the whole backlog", (ingest,))
        send_snapshot(snapshot(node_name, gpus=2))
        node = wait_for(lambda: Node.objects.filter(name=node_name).first(), 10, "the lone snapshot", (ingest,))
    assert node.gpu_count == 2
