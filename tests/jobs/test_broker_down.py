""""Diagnose now" and "Apply fix" with the broker down: the answer says nothing was
sent, and the job is closed as failed (with an audit row saying so) instead of
waiting to expire. The broker is a real Redis URL on a port nobody listens on."""

from __future__ import annotations

import socket
import time

import pytest
from django.urls import reverse

from gpufleet.audit.models import AuditEntry
from gpufleet.jobs import services
from gpufleet.jobs.models import Job, JobStatus
from tests.conftest import HANG_S
from tests.factories import hx

# Transactional: the job is sent when its transaction commits, as in production.
pytestmark = pytest.mark.django_db(transaction=True)

UNREACHABLE = "the broker is unreachable: nothing was sent"


@pytest.fixture
def broker_down(monkeypatch):
    """Every message this test sends goes to a Redis URL whose port is closed."""
    from gpufleet.celery import app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    before = app.conf.broker_url
    # Celery prefers the environment variable over its config.
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    app.conf.broker_url = url
    app._pool = None  # pooled connections are to the previous broker
    app.amqp._producer_pool = None
    yield url
    app.conf.broker_url = before
    app._pool = None
    app.amqp._producer_pool = None


def _assert_failed_and_audited(action: str) -> Job:
    job = Job.objects.get()
    assert (job.status, job.error) == (JobStatus.FAILED, UNREACHABLE)
    assert job.finished_at is not None
    asked, failed = AuditEntry.objects.order_by("id")
    assert asked.action == failed.action == action
    assert failed.after == {"job": job.pk, "status": "failed", "error": UNREACHABLE}
    return job


def test_diagnose_now_answers_htmx_with_the_failed_job(operator_client, alpha, broker_down):
    started = time.monotonic()
    response = operator_client.post(reverse("jobs:diagnose", args=["alpha"]), **hx())
    assert time.monotonic() - started < HANG_S  # it gives up on the broker by itself
    assert response.status_code == 200
    body = response.content.decode()
    assert UNREACHABLE in body
    assert "hx-trigger=\"every 1s\"" not in body  # nothing to poll for
    _assert_failed_and_audited("node.diagnose")


def test_diagnose_now_redirects_with_the_reason_without_js(operator_client, alpha, broker_down):
    response = operator_client.post(reverse("jobs:diagnose", args=["alpha"]))
    assert response.status_code == 302 and response["Location"] == "/nodes/alpha/"
    _assert_failed_and_audited("node.diagnose")
    assert UNREACHABLE in operator_client.get("/nodes/alpha/").content.decode()


def test_apply_fix_answers_htmx_with_the_failed_job(admin_role_client, alpha, broker_down):
    response = admin_role_client.post(reverse("jobs:fix", args=["alpha", "cdi"]), **hx())
    assert response.status_code == 200
    assert UNREACHABLE in response.content.decode()
    assert _assert_failed_and_audited("node.fix").fix_code == "cdi"


def test_apply_fix_redirects_with_the_reason_without_js(admin_role_client, alpha, broker_down):
    response = admin_role_client.post(reverse("jobs:fix", args=["alpha", "cdi"]))
    assert response.status_code == 302 and response["Location"] == "/nodes/alpha/"
    _assert_failed_and_audited("node.fix")
    assert UNREACHABLE in admin_role_client.get("/nodes/alpha/").content.decode()


def test_a_failed_send_does_not_block_the_next_diagnosis(alpha, admin_user, broker_down, monkeypatch):
    from gpufleet.celery import app

    first = services.request_diagnosis(alpha, admin_user)
    assert first.status == JobStatus.FAILED  # the returned job says so too
    sent: list = []
    monkeypatch.setattr(app, "send_task", lambda name, args, **options: sent.append(args))  # the broker is back
    second = services.request_diagnosis(alpha, admin_user)
    assert second.pk != first.pk and second.status == JobStatus.QUEUED
    assert sent == [[second.pk]]
