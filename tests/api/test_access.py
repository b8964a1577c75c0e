"""API access: anonymous 401, outsiders 403, viewers read but get 403 on writes,
operators and admins write; Django's CSRF check stays on for session writes."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.test import Client, override_settings

from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db

READS = [
    "/api/nodes/",
    "/api/nodes/alpha/",
    "/api/nodes/alpha/devices/",
    "/api/nodes/alpha/findings/",
    "/api/nodes/alpha/claims/",
    "/api/claims/",
]


@pytest.fixture
def train(operator):
    return claim(make_node("alpha", 4), "train", operator, count=1)


def _writes(client, train):
    """Each write, carrying the claim's version as read just before it (as a client must)."""
    new = json.dumps({"name": "new", "count": 1})
    edit = json.dumps({"name": "train", "count": 2, "updated_at": train.updated_at.isoformat()})
    writes = {
        "POST node claims": client.post("/api/nodes/alpha/claims/", new, content_type="application/json"),
        "PUT claim": client.put(f"/api/claims/{train.pk}/", edit, content_type="application/json"),
    }
    train.refresh_from_db()
    version = urlencode({"updated_at": train.updated_at.isoformat()})
    writes["DELETE claim"] = client.delete(f"/api/claims/{train.pk}/?{version}")
    return writes


def test_it_answers_anonymous_requests_with_401_json(client, train):
    for url in [*READS, f"/api/claims/{train.pk}/"]:
        response = client.get(url)
        assert response.status_code == 401, url
        assert response.json()["error"]["code"] == "login_required"
    assert {k: r.status_code for k, r in _writes(client, train).items()} == dict.fromkeys(_writes(client, train), 401)


def test_it_refuses_outsiders_everything(outsider, train):
    client = Client()
    client.force_login(outsider)
    for url in [*READS, f"/api/claims/{train.pk}/"]:
        response = client.get(url)
        assert response.status_code == 403, url
        assert response.json()["error"]["code"] == "forbidden"
    assert {k: r.status_code for k, r in _writes(client, train).items()} == dict.fromkeys(_writes(client, train), 403)
    assert list(Claim.objects.values_list("name", "count")) == [("train", 1)]


def test_it_lets_viewers_read_but_not_write(viewer_client, train):
    for url in [*READS, f"/api/claims/{train.pk}/"]:
        assert viewer_client.get(url).status_code == 200, url
    writes = _writes(viewer_client, train)
    assert {k: r.status_code for k, r in writes.items()} == dict.fromkeys(writes, 403)
    assert writes["PUT claim"].json()["error"] == {"code": "forbidden", "message": "you are in no team, so you may read claims but not book or change them"}
    assert list(Claim.objects.values_list("name", "count")) == [("train", 1)]


@pytest.mark.parametrize("persona", ["operator_client", "admin_role_client"])
def test_it_lets_operators_and_admins_write(request, train, persona):
    client = request.getfixturevalue(persona)
    writes = _writes(client, train)
    assert {k: r.status_code for k, r in writes.items()} == {
        "POST node claims": 201,
        "PUT claim": 200,
        "DELETE claim": 204,
    }


def test_it_keeps_the_csrf_check_on_session_writes(operator, train):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    body = json.dumps({"name": "script", "count": 1})
    refused = client.post("/api/nodes/alpha/claims/", body, content_type="application/json")
    assert refused.status_code == 403
    assert not Claim.objects.filter(name="script").exists()
    # Any API answer leaves the cookie whose value a script sends back as X-CSRFToken.
    client.get("/api/nodes/")
    token = client.cookies["csrftoken"].value
    accepted = client.post("/api/nodes/alpha/claims/", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 201
    wrong = client.post(
        "/api/nodes/alpha/claims/",
        json.dumps({"name": "s2", "count": 1}),
        content_type="application/json",
        HTTP_X_CSRFTOKEN="x" * 32,
    )
    assert wrong.status_code == 403


def test_it_serves_a_script_that_logs_in_like_a_browser(operator, train):
    """The documented script flow: login page, login post, then API writes."""
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")
    login = client.post(
        "/accounts/login/",
        {"username": "otto", "password": "pw-otto", "csrfmiddlewaretoken": client.cookies["csrftoken"].value},
    )
    assert login.status_code == 302
    token = client.cookies["csrftoken"].value  # rotated at login
    response = client.post(
        "/api/nodes/alpha/claims/",
        json.dumps({"name": "script", "count": 1}),
        content_type="application/json",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 201
    assert response.json()["created_by"] == "otto"


@override_settings(CSRF_FAILURE_VIEW="gpufleet.api.views.csrf_failure")
def test_it_explains_a_csrf_failure_in_json_when_configured(operator, train):
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    refused = client.post("/api/nodes/alpha/claims/", "{}", content_type="application/json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "csrf_failed"
    assert "X-CSRFToken" in refused.json()["error"]["message"]
    page = client.post("/claims/nodes/alpha/new/", {})
    assert page.status_code == 403 and "text/html" in page["Content-Type"]
