"""The centre sends a node's jobs (diagnose now, apply fix) under that node's own broker
keys (wire.node_key_prefix), where the node's user, which may use no other keys, reads
them; against a real redis-server of the test's own, with the users enroll makes."""

from __future__ import annotations

import json

import pytest

from gpufleet import wire
from gpufleet.core import agent_settings, broker_acl
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services
from tests.acl_redis import STREAM, running
from tests.factories import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def centre_broker(settings, monkeypatch):
    from gpufleet.celery import app

    for server in running():
        url = server.url()
        settings.CELERY_BROKER_URL = url
        monkeypatch.setenv("CELERY_BROKER_URL", url)
        before, app.conf.broker_url = app.conf.broker_url, url
        try:
            yield server
        finally:
            app.conf.broker_url = before


def test_diagnose_now_lands_in_the_queue_only_that_nodes_user_may_read(centre_broker, admin_user,
                                                                        django_capture_on_commit_callbacks):
    ingest_snapshot(snapshot("gpu-017", gpus=1))
    credentials.enroll("gpu-017")
    centre = centre_broker.centre()
    broker_acl.put_node_user(centre, "gpu-017", "pw", STREAM)
    with django_capture_on_commit_callbacks(execute=True):
        job = services.request_diagnosis(Node.objects.get(name="gpu-017"), admin_user)
    assert not centre.exists("node.gpu-017")  # not where every node's user could look
    agent = centre_broker.client("node:gpu-017", "pw")
    key, raw = agent.brpop([f"{wire.node_key_prefix('gpu-017')}node.gpu-017"], timeout=5)
    message = json.loads(raw)
    assert message["headers"]["task"] == wire.COLLECT_TASK and message["headers"]["argsrepr"] == f"[{job.pk}]"


def test_an_agent_uses_its_nodes_key_prefix_and_no_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GPUFLEET_NODE_NAME", "gpu-017")
    agent = agent_settings.from_environment()
    options = agent_settings.agent_celery_options(agent)
    assert options["broker_transport_options"]["global_keyprefix"] == "gpufleet:node:gpu-017:"
    assert options["task_default_queue"] == "node.gpu-017"
    worker = agent_settings.agent_worker_options(agent)
    assert worker["queues"] == ["node.gpu-017"]
    assert worker["without_heartbeat"] and worker["without_gossip"] and worker["without_mingle"]
