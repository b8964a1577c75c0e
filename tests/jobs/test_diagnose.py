"""POST /nodes/<name>/diagnose/: "diagnose now" queues a job on the node's agent."""

from unittest.mock import ANY

import pytest
from django.urls import reverse

from gpufleet.audit.models import AuditEntry
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import hx

URL = reverse("jobs:diagnose", args=["alpha"])


@pytest.mark.django_db
def test_it_creates_a_job_audits_and_dispatches_after_commit(
    operator_client, operator, alpha, sent_tasks, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = operator_client.post(URL, **hx())
    assert sent_tasks == []  # nothing leaves before the transaction commits
    for callback in callbacks:
        callback()

    assert response.status_code == 200
    job = Job.objects.get()
    assert (job.node, job.kind, job.status, job.requested_by) == (alpha, JobKind.DIAGNOSE, JobStatus.QUEUED, operator)
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.username, entry.node_name) == ("node.diagnose", "otto", "alpha")
    assert sent_tasks == [
        {"name": "gpufleet.agent.tasks.collect", "args": [job.pk], "queue": "node.alpha", "expires": 60.0,
         "retry_policy": ANY, "connection": ANY}
    ]
    # Under alpha's own broker keys, the only ones its agent's broker user may read.
    assert sent_tasks[0]["connection"].transport_options["global_keyprefix"] == "gpufleet:node:alpha:"


@pytest.mark.django_db
def test_it_returns_a_polling_job_fragment_to_htmx(operator_client, alpha, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(URL, **hx())
    job = Job.objects.get()
    body = response.content.decode()
    assert body.lstrip().startswith(f'<div id="job-{job.pk}" class="job job-queued"')
    assert f'hx-get="/jobs/{job.pk}/" hx-trigger="every 1s"' in body
    assert "<html" not in body
    assert "HX-Request" in response["Vary"]
    assert len(sent_tasks) == 1


@pytest.mark.django_db
def test_it_redirects_back_without_js(operator_client, alpha, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(URL)
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"
    page = operator_client.get("/nodes/alpha/").content.decode()
    job = Job.objects.get()
    assert "Asked alpha to diagnose itself." in page
    assert f'id="job-{job.pk}"' in page  # the page shows (and polls) the job it asked for


@pytest.mark.django_db
def test_it_reuses_an_open_job(operator_client, alpha, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        operator_client.post(URL, **hx())
        operator_client.post(URL, **hx())
    assert Job.objects.count() == 1
    assert len(sent_tasks) == 1


@pytest.mark.django_db
def test_it_refuses_viewers_and_outsiders(viewer_client, client, outsider, alpha, sent_tasks):
    assert viewer_client.post(URL).status_code == 403
    client.force_login(outsider)
    assert client.post(URL).status_code == 403
    assert not Job.objects.exists() and not AuditEntry.objects.exists()
    assert sent_tasks == []


@pytest.mark.django_db
def test_it_refuses_get(operator_client, alpha):
    assert operator_client.get(URL).status_code == 405


@pytest.mark.django_db
def test_it_needs_the_csrf_token(operator, alpha, sent_tasks):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.post(URL).status_code == 403
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_it_sends_anonymous_htmx_to_login(client, alpha):
    response = client.post(URL, **hx())
    assert response.status_code == 200 and response["HX-Redirect"].startswith("/accounts/login/")
