"""A DCGM diagnostic through the real broker, end to end: the agent worker (a real process
on a fake GPU host whose `dcgmi` prints real recordings) says it has DCGM, an admin's
request goes to its queue signed, the agent runs `dcgmi diag`, and the result comes back
through the ingest stream and consumer to the node page: a failed run fails the node until
a passed one."""

from __future__ import annotations

import pytest

from gpufleet.fleet.models import Finding, Node
from gpufleet.jobs.models import Job, JobStatus
from gpufleet.jobs.services import request_dcgm_diag
from tests.integration.workers import agent_key_env, agent_process, database_url_for_workers, ingest_consumer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _env(broker, node: str, fake_host=None) -> dict[str, str]:
    env = {**broker.env(), "DATABASE_URL": database_url_for_workers(), "GPUFLEET_NODE_NAME": node,
           "GPUFLEET_COLLECT_INTERVAL": "1"}
    if fake_host is not None:
        env.update(fake_host.env(), **agent_key_env(node))
    return env


def test_a_diagnostic_runs_on_the_node_and_ends_on_its_page(broker, fake_host, node_name, admin_user, client):
    fake_host.dcgmi("fail")
    with ingest_consumer(_env(broker, "central")) as ingest, agent_process(_env(broker, node_name, fake_host)) as agent:
        workers = (ingest, agent)
        node = wait_for(lambda: Node.objects.filter(name=node_name, dcgm__installed=True).first(), 30,
                        "a snapshot saying DCGM is installed", workers)
        assert node.dcgm["version"] == "3.3.9"

        job = request_dcgm_diag(node, 1, admin_user)
        failed = wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.DONE).first(), 30,
                          "the -r 1 run", workers)
        assert failed.result["verdict"] == "fail" and failed.started_at is not None
        assert Finding.objects.filter(node=node, code="dcgm-diag", status="fail").exists()
        assert [c["argv"] for c in fake_host.calls("dcgmi") if c["argv"][0] == "diag"] == [["diag", "-r", "1", "-j"]]

        client.force_login(admin_user)
        page = client.get(f"/nodes/{node_name}/").content.decode()
        assert "Persistence Mode: Persistence mode for GPU 0 is disabled." in page  # DCGM's own words
        assert "DCGM diagnostic -r 1 failed" in page  # the timeline
        # Later snapshots keep the finding: only a passing run clears it.
        seen = Node.objects.get(pk=node.pk).collected_at
        wait_for(lambda: Node.objects.get(pk=node.pk).collected_at > seen, 15, "a later snapshot", workers)
        assert Node.objects.get(pk=node.pk).health == "fail"

        fake_host.dcgmi_outcome("pass")
        job = request_dcgm_diag(node, 2, admin_user)
        passed = wait_for(lambda: Job.objects.filter(pk=job.pk, status=JobStatus.DONE).first(), 30,
                          "the -r 2 run", workers)
        assert passed.result["verdict"] == "pass"
        assert not Finding.objects.filter(node=node, code="dcgm-diag").exists()
        assert "DCGM diagnostic -r 2 passed" in client.get(f"/nodes/{node_name}/").content.decode()
