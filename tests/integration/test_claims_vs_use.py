"""Claims against real use, end to end: a fake GPU host whose nvidia-smi lists a
process in a Docker container, its agent a real `celery worker` appending to the
Redis ingest stream, read by a real `manage.py ingest`. The node page then shows the GPU used without a
claim, and the claim whose GPU did nothing for the (shortened) idle hours."""

from __future__ import annotations

from html import unescape

import pytest

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.fakes.recorded import DATA_DIR
from tests.integration.workers import agent_key_env, agent_process, database_url_for_workers, ingest_consumer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CONTAINER_ID = "4f1d9c2b8e7a1d2c3b4a5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e"
GPU1 = "GPU-6b3c1a1e-4f1d-9c2b-8e7a-1d2c3b4a5f61"  # 12 % busy in the recording; GPU 0 is at 0 %
IDLE_HOURS = "0.001"  # 3.6 s: the rule is the same, the wait is short


def test_the_node_page_shows_a_gpu_used_without_a_claim_and_a_claim_left_idle(
    broker, fake_host, node_name, operator, viewer_client, tmp_path
):
    fake_host.smi(DATA_DIR / "health" / "smi-8x-h100.csv")
    fake_host.compute_apps(f"{GPU1}, 4412, python3, 30211\n")
    proc = tmp_path / "proc"
    (proc / "4412").mkdir(parents=True)
    (proc / "4412" / "cgroup").write_text(f"0::/system.slice/docker-{CONTAINER_ID}.scope\n")
    fake_host.engine.containers = [
        {"Id": CONTAINER_ID, "Names": ["/trainer"], "Image": "pytorch/pytorch:2.5.1", "Labels": {}},
    ]
    common = {**broker.env(), "DATABASE_URL": database_url_for_workers(), "GPUFLEET_COLLECT_INTERVAL": "1"}
    central = {**common, "GPUFLEET_NODE_NAME": "central", "GPUFLEET_IDLE_HOURS": IDLE_HOURS}
    agent = {**common, **fake_host.env(), "GPUFLEET_NODE_NAME": node_name,
             "GPUFLEET_PROC_ROOT": str(proc), **agent_key_env(node_name)}

    with ingest_consumer(central) as ingest, \
         agent_process(agent) as worker:
        workers = (ingest, worker)
        node = wait_for(lambda: Node.objects.filter(name=node_name, gpu_count=8).first(), 30,
                        "the agent's first snapshot", workers)
        claims.save_claim(node, gpu.Claim(name="notebooks", device_ids=("0",)), operator)
        wait_for(lambda: node.findings.filter(code="claim-idle").exists(), 30,
                 "the idle claim to be found", workers)

    node = Node.objects.get(pk=node.pk)
    assert node.findings.filter(code="use-unclaimed").exists()
    assert Claim.objects.get(name="notebooks").idle_since is not None
    page = unescape(viewer_client.get(f"/nodes/{node_name}/").content.decode())
    assert "Used but unclaimed" in page and "GPU 1 (container trainer)" in page
    assert "Claimed but idle" in page and "'notebooks' (GPU 0)" in page
    listed = unescape(viewer_client.get(f"/claims/use/?q={node_name}").content.decode())
    assert "Used but unclaimed" in listed and "Claimed but idle" in listed
