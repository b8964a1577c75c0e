"""The agent's side of node identity: what it sends is signed with its key and the
centre stores it; what it is asked to do for a job runs only when the centre signed
it for this node, recently, and a fix only once per job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from gpufleet import wire
from gpufleet.agent import tasks as agent
from gpufleet.agent.fixes import FixRun
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import ingest, snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(monkeypatch, stream_outbox):
    """What the agent appends to the ingest stream, kept instead of sent."""
    monkeypatch.setattr(agent, "snapshot_this_host", lambda: snapshot("alpha", 2))
    return stream_outbox


@pytest.fixture
def alpha_agent(settings):
    key = credentials.enroll("alpha")
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_AGENT_KEY = "alpha", str(key)
    return key


def test_what_the_agent_sends_is_signed_and_stored(alpha_agent, outbox):
    agent.collect.run()
    assert outbox.kinds() == [wire.SNAPSHOT]
    assert (outbox[0][b"node"], outbox[0][b"gen"]) == (b"alpha", str(alpha_agent.generation).encode())
    # The snapshot travels as its JSON text, signed as it is.
    [[text, job_id]] = outbox.payloads()
    assert wire.decode_snapshot(text)["node"] == "alpha" and job_id is None
    assert outbox.deliver() == ["accepted"]
    assert Node.objects.get(name="alpha").gpu_count == 2


def test_a_diagnose_request_the_centre_signed_runs_and_finishes_its_job(alpha_agent, outbox):
    job = Job.objects.create(node=ingest("alpha", 2), kind=JobKind.DIAGNOSE)
    agent.collect.run(job.pk, auth=credentials.sign_for_agent("alpha", wire.COLLECT_TASK, [job.pk]))
    assert outbox.kinds() == [wire.PROGRESS, wire.SNAPSHOT]
    assert outbox.deliver() == ["progress", "accepted"]
    job.refresh_from_db()
    assert job.status == JobStatus.DONE


@pytest.mark.parametrize("case", ["unsigned", "for another node", "other task", "too old", "other job"])
def test_the_agent_runs_no_job_the_centre_did_not_sign_for_it(alpha_agent, outbox, case, caplog, settings):
    credentials.enroll("bravo")
    job_id = 7
    auth = {
        "unsigned": None,
        "for another node": credentials.sign_for_agent("bravo", wire.COLLECT_TASK, [job_id]),
        "other task": credentials.sign_for_agent("alpha", wire.APPLY_FIX_TASK, [job_id]),
        "too old": wire.sign(alpha_agent, "alpha", wire.TO_AGENT, wire.COLLECT_TASK, [job_id],
                             at=datetime.now(UTC) - timedelta(seconds=settings.GPUFLEET_JOB_TIMEOUT + 5)),
        "other job": credentials.sign_for_agent("alpha", wire.COLLECT_TASK, [job_id + 1]),
    }[case]
    agent.collect.run(job_id, auth=auth)
    assert outbox == []
    assert f"refused {wire.COLLECT_TASK}" in caplog.text


def test_a_snapshot_the_agent_signed_cannot_pass_for_a_task_from_the_centre(alpha_agent, outbox):
    # The same key signs both ways; the direction in the signed text keeps them apart.
    forged = wire.sign(alpha_agent, "alpha", wire.TO_CENTRE, wire.COLLECT_TASK, [7])
    agent.collect.run(7, auth=forged)
    assert outbox == []


def test_a_signed_fix_runs_once_per_job(alpha_agent, outbox, monkeypatch):
    runs = []
    monkeypatch.setattr(agent, "run_fix", lambda code: runs.append(code) or FixRun(True, "generated"))
    auth = credentials.sign_for_agent("alpha", wire.APPLY_FIX_TASK, [11, "cdi"])
    agent.apply_fix.run(11, "cdi", auth=auth)
    agent.apply_fix.run(11, "cdi", auth=auth)  # replayed from the broker
    assert runs == ["cdi"]
    # A signature for one code does not cover another.
    agent.apply_fix.run(11, "toolkit", auth=auth)
    agent.apply_fix.run(12, "toolkit", auth=auth)
    assert runs == ["cdi"]


def test_an_agent_without_a_key_says_so_and_sends_nothing(settings, outbox, caplog):
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_AGENT_KEY = "alpha", ""
    agent.collect.run()
    assert "not enrolled (GPUFLEET_AGENT_KEY is not set)" in caplog.text and "manage.py enroll alpha" in caplog.text
    assert outbox == []  # an entry needs a key generation and a signature: the centre would refuse it
    assert not Node.objects.exists()


def test_an_unreadable_key_is_named(settings, outbox, caplog):
    settings.GPUFLEET_NODE_NAME, settings.GPUFLEET_AGENT_KEY = "alpha", "not-a-key"
    agent.collect.run()
    assert "GPUFLEET_AGENT_KEY is not a node key" in caplog.text


@override_settings(GPUFLEET_NODE_NAME="alpha")
def test_a_key_file_in_the_data_dir_is_read_when_the_environment_has_none(tmp_path, monkeypatch):
    import importlib

    from gpufleet.env import write_private_text

    write_private_text(tmp_path / "agent-alpha.key", "1.abc")
    assert (tmp_path / "agent-alpha.key").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("GPUFLEET_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("GPUFLEET_NODE_NAME", "alpha")
    monkeypatch.delenv("GPUFLEET_AGENT_KEY", raising=False)
    import gpufleet.settings as project_settings

    try:
        assert importlib.reload(project_settings).GPUFLEET_AGENT_KEY == "1.abc"
    finally:
        monkeypatch.undo()
        importlib.reload(project_settings)
