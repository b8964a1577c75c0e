"""Jobs: asking an agent for work, and what its reports do to the job row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.audit.models import AuditEntry
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import IngestResult, finish_diagnosis, ingest_snapshot
from gpufleet.jobs import services
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture
def node():
    ingest_snapshot(snapshot("alpha", gpus=2, fixes=["cdi"]))
    return Node.objects.get(name="alpha")


@pytest.fixture
def sent(monkeypatch):
    from gpufleet.celery import app

    calls = []
    monkeypatch.setattr(app, "send_task", lambda name, args, queue, **kw: calls.append((name, args, queue)))
    return calls


def test_it_sends_collect_to_the_nodes_own_queue_after_commit(node, admin_user, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = services.request_diagnosis(node, admin_user)
        assert sent == []  # not before the row is committed
    for callback in callbacks:
        callback()
    assert sent == [("gpufleet.agent.tasks.collect", [job.pk], "node.alpha")]
    assert job.status == JobStatus.QUEUED and job.kind == JobKind.DIAGNOSE
    entry = AuditEntry.objects.get(action="node.diagnose")
    assert entry.username == admin_user.username and entry.node == node


def test_it_reuses_an_open_diagnosis_instead_of_piling_up(node, admin_user, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = services.request_diagnosis(node, admin_user)
        second = services.request_diagnosis(node, admin_user)
    assert first.pk == second.pk
    assert len(sent) == 1


def test_it_refuses_a_fix_the_node_does_not_allow(node, admin_user, sent):
    with pytest.raises(services.FixNotAllowed):
        services.request_fix(node, "toolkit", admin_user)
    assert Job.objects.count() == 0 and sent == []


def test_it_sends_an_allowed_fix_by_code_only(node, admin_user, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job = services.request_fix(node, "cdi", admin_user)
    assert sent == [("gpufleet.agent.tasks.apply_fix", [job.pk, "cdi"], "node.alpha")]
    assert AuditEntry.objects.get(action="node.fix").target == "cdi"


def test_progress_moves_an_open_job_and_never_reopens_a_finished_one(node, admin_user):
    job = Job.objects.create(node=node, kind=JobKind.FIX, fix_code="cdi", requested_by=admin_user)
    assert services.report_progress(job.pk, "running")
    assert services.report_progress(job.pk, "done", "$ nvidia-ctk cdi generate\nok")
    assert not services.report_progress(job.pk, "running")  # a late duplicate
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and job.output.endswith("ok")
    assert job.started_at is not None and job.finished_at is not None


def test_a_diagnosis_fails_when_its_snapshot_was_rejected(node):
    job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE)
    finish_diagnosis(job.pk, IngestResult("rejected", "alpha", "invalid snapshot: devices.0.index"))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "devices.0.index" in job.error


def test_jobs_the_node_does_not_answer_expire(node, settings):
    settings.GPUFLEET_JOB_TIMEOUT = 60
    now = timezone.now()
    old = Job.objects.create(node=node, kind=JobKind.DIAGNOSE, created_at=now - timedelta(seconds=61))
    fresh = Job.objects.create(node=node, kind=JobKind.FIX, fix_code="cdi", created_at=now - timedelta(seconds=5))
    assert services.expire_jobs(now) == 1
    old.refresh_from_db()
    fresh.refresh_from_db()
    assert old.status == JobStatus.EXPIRED and "did not answer" in old.error
    assert fresh.status == JobStatus.QUEUED


def test_progress_text_is_stored_without_nul_or_control_characters(node):
    # An agent that does not clean its fix output (a broken or hostile one) sends it as the command printed it.
    job = Job.objects.create(node=node, kind=JobKind.FIX, fix_code="cdi")
    assert services.report_progress(job.pk, "failed", "line\x00one\r\nline\ttwo", "nvidia-ctk \x1b[31mfailed\x00")
    job.refresh_from_db()
    assert (job.status, job.output, job.error) == (JobStatus.FAILED, "line one \nline\ttwo", "nvidia-ctk  [31mfailed ")
