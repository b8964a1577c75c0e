"""/nodes/<name>/dcgm-diag/<level>/: DCGM's diagnostic asked of a node's agent (admins
only; GET confirms, POST queues), and what happens when its result comes back: kept on
the job, the node's last run, a failing finding until a run passes, an event of the
node's timeline. The results are real dcgmi outputs (tests/fakes/data/dcgmi/)."""

from datetime import timedelta
from unittest.mock import ANY

import pytest
from django.db import OperationalError
from django.urls import reverse
from django.utils import timezone

from gpufleet.audit.models import AuditEntry
from gpufleet.events.models import Event, Kind
from gpufleet.fleet.models import Finding, Node
from gpufleet.gpu.dcgm import DcgmInfo
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import hx, snapshot
from tests.fakes.recorded import recording

URL1 = reverse("jobs:dcgm_diag", args=["alpha", 1])
URL2 = reverse("jobs:dcgm_diag", args=["alpha", 2])


DCGM_339 = DcgmInfo(True, "3.3.9")


def _with_dcgm(name: str = "alpha", info: DcgmInfo | None = DCGM_339, at=None) -> Node:
    snap = snapshot(name, 8, at=at)
    if info is not None:
        snap["dcgm"] = info.to_dict()
    assert ingest_snapshot(snap).outcome == "accepted"
    return Node.objects.get(name=name)


@pytest.fixture
def alpha(db):
    return _with_dcgm()


def _finish(job: Job, name: str, status: str = "done") -> Job:
    services.report_progress(job.pk, JobStatus.RUNNING, node=job.node.name)
    services.report_progress(job.pk, status, recording(f"dcgmi/{name}"), node=job.node.name)
    job.refresh_from_db()
    return job


@pytest.mark.django_db
def test_it_asks_for_confirmation_before_the_medium_run(admin_role_client, alpha):
    response = admin_role_client.get(URL2)
    page = response.content.decode()
    assert response.status_code == 200
    assert "Run DCGM's medium (-r 2) diagnostic on alpha?" in page
    assert "$ dcgmi diag -r 2 -j" in page and "loads every GPU" in page
    assert f'<form method="post" action="{URL2}"' in page and "csrfmiddlewaretoken" in page
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_it_queues_the_run_signed_for_the_node_and_audits(admin_role_client, admin_user, alpha, sent_tasks,
                                                          django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_role_client.post(URL1)
    assert response.status_code == 302 and response["Location"] == "/nodes/alpha/"
    job = Job.objects.get()
    assert (job.kind, job.level, job.requested_by, job.status) == (JobKind.DCGM_DIAG, 1, admin_user, "queued")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target, entry.after) == ("node.dcgm_diag", "dcgmi diag -r 1", {"job": job.pk, "level": 1})
    assert sent_tasks == [{"name": "gpufleet.agent.tasks.run_dcgm_diag", "args": [job.pk, 1], "queue": "node.alpha",
                           "expires": 60.0, "retry_policy": ANY, "connection": ANY}]
    assert sent_tasks[0]["connection"].transport_options["global_keyprefix"] == "gpufleet:node:alpha:"


@pytest.mark.django_db
def test_htmx_gets_the_job_and_a_second_click_reuses_the_open_run(admin_role_client, alpha, sent_tasks,
                                                                   django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = admin_role_client.post(URL1, **hx())
        admin_role_client.post(URL2, **hx())
    job = Job.objects.get()
    assert first.content.decode().lstrip().startswith(f'<div id="job-{job.pk}"')
    assert "DCGM diagnostic -r 1" in first.content.decode()
    assert len(sent_tasks) == 1 and AuditEntry.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("info", [DcgmInfo(False, problem="dcgmi not found on PATH"), None])
def test_a_node_without_dcgm_says_so_and_how_to_install_it(admin_role_client, db, sent_tasks, info):
    _with_dcgm(info=info)
    page = admin_role_client.get("/nodes/alpha/").content.decode()
    assert "no diagnostic can run here" in page and "datacenter-gpu-manager-4-cuda12" in page
    assert "Run diagnostic: DCGM not installed" in page and URL1 not in page
    response = admin_role_client.post(URL1, **hx())
    assert response.status_code == 200 and "No DCGM diagnostic was asked: alpha has no DCGM" in response.content.decode()
    assert "datacenter-gpu-manager-4-cuda12" in response.content.decode()
    assert not Job.objects.exists() and not AuditEntry.objects.exists() and sent_tasks == []


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_only_admins_run_diagnostics(request, alpha, sent_tasks, persona):
    client = request.getfixturevalue(persona)
    assert client.get(URL2).status_code == 403 and client.post(URL1).status_code == 403
    assert not Job.objects.exists() and sent_tasks == []
    # They see DCGM and the results, not the buttons.
    page = client.get("/nodes/alpha/").content.decode()
    assert "DCGM 3.3.9" in page and URL1 not in page


@pytest.mark.django_db
def test_levels_not_offered_are_404(admin_role_client, alpha):
    assert admin_role_client.post(reverse("jobs:dcgm_diag", args=["alpha", 3])).status_code == 404
    assert admin_role_client.post(reverse("jobs:dcgm_diag", args=["nope", 1])).status_code == 404


@pytest.mark.django_db
def test_a_failed_run_is_a_failing_finding_on_the_page_until_a_passed_run(admin_role_client, admin_user, alpha,
                                                                          sent_tasks):
    job = _finish(services.request_dcgm_diag(alpha, 1, admin_user), "diag-r1-fail-4.2.3-gb10.json")
    assert job.status == "done" and job.result["verdict"] == "fail"
    assert [t["name"] for t in job.result["tests"]] == ["software"]
    node = Node.objects.get(pk=alpha.pk)
    assert node.diagnostic["verdict"] == "fail" and node.diagnostic["job"] == job.pk
    finding = Finding.objects.get(node=node, code="dcgm-diag")
    assert finding.status == "fail" and "software (Persistence Mode: Persistence mode for GPU 0" in finding.message
    assert node.health == "fail" and node.problem.startswith("DCGM diagnostic: DCGM diagnostic -r 1")
    event = Event.objects.get(kind=Kind.DIAGNOSTIC)
    assert (event.severity, event.job_id, event.node_id) == ("fail", job.pk, node.pk)
    assert event.message.startswith("DCGM diagnostic -r 1 failed: 1 of 1 tests failed: software")

    page = admin_role_client.get("/nodes/alpha/").content.decode()
    assert "Persistence Mode: Persistence mode for GPU 0 is disabled." in page  # DCGM's message, per test
    assert "DCGM 4.2.3, driver 580.82.09" in page and "DCGM diagnostic -r 1 failed" in page  # panel and timeline

    # Snapshots keep the finding: the agent knows nothing of it, the centre does.
    _with_dcgm(at=timezone.now() + timedelta(seconds=5))
    assert Finding.objects.filter(node=node, code="dcgm-diag", status="fail").exists()
    assert Node.objects.get(pk=node.pk).health == "fail"

    passed = _finish(services.request_dcgm_diag(node, 2, admin_user), "diag-r2-pass-4.4.2.json")
    assert passed.result["verdict"] == "pass"
    assert not Finding.objects.filter(code="dcgm-diag").exists()
    node.refresh_from_db()
    assert node.health == "ok" and node.diagnostic["verdict"] == "pass"
    _with_dcgm(at=timezone.now() + timedelta(seconds=10))
    assert not Finding.objects.filter(code="dcgm-diag").exists()


@pytest.mark.django_db(transaction=True)
def test_a_report_whose_result_cannot_be_recorded_leaves_the_run_open_for_the_report_again(
        admin_user, alpha, sent_tasks, monkeypatch):
    # The consumer takes a report it could not handle again: the run must still be open then,
    # or its result, finding and event are never recorded (and a page meanwhile reads done
    # without them).
    job = services.request_dcgm_diag(alpha, 1, admin_user)
    services.report_progress(job.pk, JobStatus.RUNNING, node="alpha")
    real = services.diagnostics.record_run

    def lost(*args):
        raise OperationalError("the database went away")

    monkeypatch.setattr(services.diagnostics, "record_run", lost)
    with pytest.raises(OperationalError):
        services.report_progress(job.pk, "done", recording("dcgmi/diag-r1-fail-4.2.3-gb10.json"), node="alpha")
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
    monkeypatch.setattr(services.diagnostics, "record_run", real)
    assert services.report_progress(job.pk, "done", recording("dcgmi/diag-r1-fail-4.2.3-gb10.json"), node="alpha")
    assert Job.objects.get(pk=job.pk).status == JobStatus.DONE
    assert Finding.objects.filter(node=alpha, code="dcgm-diag", status="fail").exists()


@pytest.mark.django_db
def test_the_text_form_is_read_when_dcgmi_printed_no_json(admin_user, alpha, sent_tasks):
    job = _finish(services.request_dcgm_diag(alpha, 1, admin_user), "diag-r1-fail-3.1.8-h200.txt")
    assert job.result["form"] == "text" and job.result["verdict"] == "fail" and job.result["version"] == "3.1.8"
    persistence = next(t for t in job.result["tests"] if t["name"] == "Persistence Mode")
    assert persistence["messages"][0].startswith("Persistence mode for GPU 0 is currently disabled.")


@pytest.mark.django_db
def test_a_run_that_could_not_run_leaves_the_last_result_and_says_why(admin_user, alpha, sent_tasks):
    _finish(services.request_dcgm_diag(alpha, 1, admin_user), "diag-r1-fail-4.2.3-gb10.json")
    job = services.request_dcgm_diag(alpha, 1, admin_user)
    services.report_progress(job.pk, JobStatus.FAILED, recording("dcgmi/diag-no-hostengine.txt"),
                             "unable to establish a connection to the specified host: localhost", node="alpha")
    job.refresh_from_db()
    assert job.result["verdict"] == "error" and "unable to establish a connection" in job.result["error"]
    node = Node.objects.get(pk=alpha.pk)
    assert node.diagnostic["verdict"] == "fail"  # still the last run that ran
    assert Finding.objects.get(node=node, code="dcgm-diag").status == "fail"
    assert Event.objects.filter(kind=Kind.DIAGNOSTIC, severity="warn", job=job).exists()


@pytest.mark.django_db
def test_a_node_reports_only_on_its_own_runs(admin_user, alpha, sent_tasks):
    other = _with_dcgm("beta")
    job = services.request_dcgm_diag(other, 1, admin_user)
    services.report_progress(job.pk, "done", recording("dcgmi/diag-r1-fail-4.2.3-gb10.json"), node="alpha")
    job.refresh_from_db()
    assert job.status == "queued" and job.result is None
    assert Node.objects.get(pk=other.pk).diagnostic == {}


@pytest.mark.django_db
def test_a_running_diagnostic_has_the_run_time_before_it_expires(admin_user, alpha, sent_tasks, settings):
    settings.GPUFLEET_JOB_TIMEOUT, settings.GPUFLEET_DCGM_DIAG_TIMEOUT = 60, 900
    diag = services.request_dcgm_diag(alpha, 2, admin_user)
    services.report_progress(diag.pk, JobStatus.RUNNING, node="alpha")
    diagnose = services.request_diagnosis(alpha, admin_user)
    services.report_progress(diagnose.pk, JobStatus.RUNNING, node="alpha")
    now = timezone.now()
    assert services.expire_jobs(now + timedelta(seconds=120)) == 1
    assert Job.objects.get(pk=diag.pk).status == "running" and Job.objects.get(pk=diagnose.pk).status == "expired"
    assert services.expire_jobs(now + timedelta(seconds=60 + 900 + 31)) == 1
    assert Job.objects.get(pk=diag.pk).status == "expired"
    # One never picked up is unanswered after the job timeout, as any job.
    queued = services.request_dcgm_diag(alpha, 1, admin_user)
    assert services.expire_jobs(now + timedelta(seconds=61)) == 1
    assert Job.objects.get(pk=queued.pk).status == "expired"
