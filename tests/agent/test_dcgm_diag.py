"""The agent's side of DCGM diagnostics, on a fake host whose `dcgmi` prints real
recordings: it says in each snapshot whether DCGM is installed, and runs `dcgmi diag`
only when the centre signed that job for this node, once, reporting what dcgmi printed
and a snapshot after; the centre reads the result from that."""

from __future__ import annotations

import pytest

from gpufleet import wire
from gpufleet.agent import tasks as agent
from gpufleet.agent.host import snapshot_this_host
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Finding, Node
from gpufleet.jobs.models import Job, JobKind, JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha_agent(settings, fake_host):
    key = credentials.enroll("alpha")
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_AGENT_KEY = "alpha", str(key)
    return key


def _diag_calls(fake_host) -> list[list[str]]:
    return [c["argv"] for c in fake_host.calls("dcgmi") if c["argv"][:1] == ["diag"]]


def test_each_snapshot_says_whether_dcgm_is_installed(fake_host, stream_outbox, alpha_agent):
    assert snapshot_this_host("alpha")["dcgm"] == {"installed": False, "version": "", "problem": "dcgmi not found on PATH"}
    fake_host.dcgmi()
    assert snapshot_this_host("alpha")["dcgm"] == {"installed": True, "version": "3.3.9", "problem": ""}
    assert fake_host.calls("dcgmi")[-1]["argv"] == ["--version"] and fake_host.calls("dcgmi")[-1]["lc_all"] == "C"
    agent.collect.run()
    assert stream_outbox.deliver() == ["accepted"]
    assert Node.objects.get(name="alpha").dcgm["version"] == "3.3.9"


@pytest.mark.parametrize(("result", "verdict", "finding"), [("fail", "fail", True), ("pass", "pass", False)])
def test_a_signed_run_reports_what_dcgmi_printed_once(fake_host, stream_outbox, alpha_agent, result, verdict, finding):
    fake_host.dcgmi(result)
    agent.collect.run()
    stream_outbox.deliver()
    job = Job.objects.create(node=Node.objects.get(name="alpha"), kind=JobKind.DCGM_DIAG, level=1)
    auth = credentials.sign_for_agent("alpha", wire.DCGM_DIAG_TASK, [job.pk, 1])
    agent.run_dcgm_diag.run(job.pk, 1, auth=auth)
    assert _diag_calls(fake_host) == [["diag", "-r", "1", "-j"]]  # JSON, and no second run
    assert stream_outbox.kinds()[-3:] == [wire.PROGRESS, wire.PROGRESS, wire.SNAPSHOT]
    assert stream_outbox.deliver()[-3:] == ["progress", "progress", "accepted"]
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and job.result["verdict"] == verdict and job.result["form"] == "json"
    assert Finding.objects.filter(node=job.node, code="dcgm-diag", status="fail").exists() == finding
    # Replayed from the broker: nothing runs again.
    agent.run_dcgm_diag.run(job.pk, 1, auth=auth)
    assert len(_diag_calls(fake_host)) == 1


def test_a_dcgmi_without_json_is_read_from_its_table(fake_host, stream_outbox, alpha_agent):
    fake_host.dcgmi("fail", json_output=False)
    job = Job.objects.create(node=Node.objects.create(name="alpha"), kind=JobKind.DCGM_DIAG, level=2)
    agent.run_dcgm_diag.run(job.pk, 2, auth=credentials.sign_for_agent("alpha", wire.DCGM_DIAG_TASK, [job.pk, 2]))
    stream_outbox.deliver()
    job.refresh_from_db()
    assert job.result["form"] == "text" and job.result["verdict"] == "fail"
    assert "GPU Memory" in [t["name"] for t in job.result["tests"] if t["status"] == "fail"]


def test_a_stopped_host_engine_fails_the_job_with_dcgms_words(fake_host, stream_outbox, alpha_agent):
    fake_host.dcgmi("no-hostengine")
    job = Job.objects.create(node=Node.objects.create(name="alpha"), kind=JobKind.DCGM_DIAG, level=1)
    agent.run_dcgm_diag.run(job.pk, 1, auth=credentials.sign_for_agent("alpha", wire.DCGM_DIAG_TASK, [job.pk, 1]))
    stream_outbox.deliver()
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "unable to establish a connection" in job.error
    assert job.result["verdict"] == "error"


@pytest.mark.parametrize("case", ["unsigned", "other level", "level not offered"])
def test_nothing_runs_that_the_centre_did_not_sign_or_does_not_offer(fake_host, stream_outbox, alpha_agent, case):
    fake_host.dcgmi()
    sign = {"unsigned": None,
            "other level": credentials.sign_for_agent("alpha", wire.DCGM_DIAG_TASK, [5, 2]),
            "level not offered": credentials.sign_for_agent("alpha", wire.DCGM_DIAG_TASK, [5, 3])}[case]
    agent.run_dcgm_diag.run(5, 3 if case == "level not offered" else 1, auth=sign)
    assert _diag_calls(fake_host) == [] and stream_outbox.kinds() == []
