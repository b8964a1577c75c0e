"""/nodes/<name>/fix/<code>/: GET confirms (works without JavaScript), POST queues
the fix on the node's agent; only admins, only for codes the node allows."""

from unittest.mock import ANY

import pytest
from django.urls import reverse

from gpufleet.audit.models import AuditEntry
from gpufleet.jobs.models import Job, JobKind
from tests.factories import hx

URL = reverse("jobs:fix", args=["alpha", "cdi"])


@pytest.mark.django_db
def test_it_asks_for_confirmation(admin_role_client, alpha):
    response = admin_role_client.get(URL)
    page = response.content.decode()
    assert response.status_code == 200
    assert "Apply the fix for “cdi” on alpha?" in page
    assert "$ nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in page  # what the agent runs
    assert f'<form method="post" action="{URL}"' in page and "csrfmiddlewaretoken" in page
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_it_queues_the_fix_and_audits(admin_role_client, admin_user, alpha, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_role_client.post(URL)
    assert response.status_code == 302 and response["Location"] == "/nodes/alpha/"
    job = Job.objects.get()
    assert (job.kind, job.fix_code, job.requested_by) == (JobKind.FIX, "cdi", admin_user)
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target, entry.username) == ("node.fix", "cdi", "ada")
    assert sent_tasks == [
        {"name": "gpufleet.agent.tasks.apply_fix", "args": [job.pk, "cdi"], "queue": "node.alpha", "expires": 60.0,
         "retry_policy": ANY, "connection": ANY}
    ]
    # Under alpha's own broker keys, the only ones its agent's broker user may read.
    assert sent_tasks[0]["connection"].transport_options["global_keyprefix"] == "gpufleet:node:alpha:"


@pytest.mark.django_db
def test_it_returns_the_job_fragment_to_htmx(admin_role_client, alpha, sent_tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_role_client.post(URL, **hx())
    job = Job.objects.get()
    body = response.content.decode()
    assert body.lstrip().startswith(f'<div id="job-{job.pk}"')
    assert f'hx-get="/jobs/{job.pk}/" hx-trigger="every 1s"' in body
    assert "Apply fix “cdi”" in body


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post"])
def test_it_refuses_codes_the_node_does_not_allow(admin_role_client, alpha, sent_tasks, method):
    url = reverse("jobs:fix", args=["alpha", "runtime"])
    assert getattr(admin_role_client, method)(url).status_code == 403
    assert not Job.objects.exists() and not AuditEntry.objects.exists()
    assert sent_tasks == []


@pytest.mark.django_db
@pytest.mark.parametrize("persona", ["viewer_client", "operator_client"])
def test_it_refuses_roles_without_apply_fix(request, alpha, sent_tasks, persona):
    client = request.getfixturevalue(persona)
    assert client.get(URL).status_code == 403
    assert client.post(URL).status_code == 403
    assert not Job.objects.exists()
    assert sent_tasks == []


@pytest.mark.django_db
def test_it_404s_for_unknown_nodes(admin_role_client):
    assert admin_role_client.post("/nodes/nope/fix/cdi/").status_code == 404
