"""GET /jobs/<pk>/: the job fragment polls until the job is finished, then asks
the node page to reload its findings."""

import json

import pytest
from django.urls import reverse

from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import hx


def _job(node, status, kind=JobKind.DIAGNOSE, **fields) -> Job:
    return Job.objects.create(node=node, kind=kind, status=status, **fields)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status,text",
    [
        (JobStatus.QUEUED, "Waiting for the agent on alpha"),
        (JobStatus.RUNNING, "The agent on alpha is working on it"),
    ],
)
def test_it_keeps_polling_open_jobs(viewer_client, alpha, status, text):
    job = _job(alpha, status)
    response = viewer_client.get(reverse("jobs:status", args=[job.pk]), **hx())
    body = response.content.decode()
    assert f'hx-get="/jobs/{job.pk}/" hx-trigger="every 1s" hx-swap="outerHTML"' in body
    assert text in body
    assert JobStatus(status).label in body
    assert "HX-Trigger" not in response
    assert "HX-Request" in response["Vary"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status,kind,text",
    [
        (JobStatus.DONE, JobKind.DIAGNOSE, "New report stored"),
        (JobStatus.DONE, JobKind.FIX, "Fix applied. The node diagnoses itself again"),
        (JobStatus.FAILED, JobKind.FIX, "Failed: nvidia-ctk exited with code 1"),
        (JobStatus.EXPIRED, JobKind.DIAGNOSE, "No answer: alpha did not answer in time"),
    ],
)
def test_it_stops_polling_finished_jobs_and_refreshes_findings(viewer_client, alpha, status, kind, text):
    job = _job(alpha, status, kind=kind, fix_code="cdi" if kind == JobKind.FIX else "", error="nvidia-ctk exited with code 1")
    response = viewer_client.get(reverse("jobs:status", args=[job.pk]), **hx())
    body = response.content.decode()
    assert "hx-trigger" not in body
    assert text in body
    assert json.loads(response["HX-Trigger"]) == {"findings-changed": {}}


@pytest.mark.django_db
def test_it_shows_output_escaped(viewer_client, alpha):
    job = _job(alpha, JobStatus.DONE, kind=JobKind.FIX, fix_code="cdi", output="$ nvidia-ctk cdi generate\n<b>ok</b>")
    body = viewer_client.get(reverse("jobs:status", args=[job.pk]), **hx()).content.decode()
    assert '<pre class="output">$ nvidia-ctk cdi generate\n&lt;b&gt;ok&lt;/b&gt;</pre>' in body


@pytest.mark.django_db
def test_it_is_a_full_page_without_htmx(viewer_client, alpha):
    job = _job(alpha, JobStatus.RUNNING)
    response = viewer_client.get(reverse("jobs:status", args=[job.pk]))
    page = response.content.decode()
    assert "<html" in page and 'href="/nodes/alpha/"' in page and "Reload" in page
    assert "HX-Trigger" not in response


@pytest.mark.django_db
def test_it_404s_for_unknown_jobs(viewer_client):
    assert viewer_client.get("/jobs/999/").status_code == 404
