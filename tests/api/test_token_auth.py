"""`Authorization: Bearer <token>`: the token acts as its user under the same role rules
as the pages, a read token never writes, a revoked or unknown one gets 401, and no CSRF
token is needed (a header is no ambient credential)."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.test import Client
from django.utils import timezone

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def bearer(user, scope="read_write") -> Client:
    """A client that sends only a fresh token of `user`: no session, CSRF enforced."""
    _, secret = ApiToken.issue(user, "script", scope)
    return Client(enforce_csrf_checks=True, headers={"authorization": f"Bearer {secret}"})


def _post(client, name="job"):
    return client.post("/api/nodes/alpha/claims/", json.dumps({"name": name, "count": 1}), content_type="application/json")


@pytest.fixture
def alpha():
    return make_node("alpha", 4)


def test_it_reads_with_a_token(viewer, alpha):
    client = bearer(viewer, "read")
    for url in ["/api/nodes/", "/api/nodes/alpha/", "/api/claims/"]:
        assert client.get(url).status_code == 200, url
    assert client.get("/api/nodes/").json()["results"][0]["name"] == "alpha"


def test_it_writes_with_a_read_write_token_when_the_role_may(operator, alpha):
    client = bearer(operator)
    response = _post(client)
    assert response.status_code == 201
    assert response.json()["created_by"] == "otto"
    entry = AuditEntry.objects.get(action="claim.create")
    assert entry.user == operator


def test_it_needs_no_csrf_token_with_a_bearer_token(operator, alpha):
    client = bearer(operator)
    train = Claim.objects.get(pk=_post(client, "train").json()["id"])
    edit = json.dumps({"name": "train", "count": 2, "updated_at": train.updated_at.isoformat()})
    assert client.put(f"/api/claims/{train.pk}/", edit, content_type="application/json").status_code == 200
    train.refresh_from_db()
    assert client.delete(f"/api/claims/{train.pk}/", QUERY_STRING=f"updated_at={quote(train.updated_at.isoformat())}").status_code == 204
    assert "csrftoken" not in client.cookies


def test_it_never_writes_with_a_read_token(operator, admin_user, alpha):
    train = claim(alpha, "train", operator, count=1)
    for user in (operator, admin_user):
        client = bearer(user, "read")
        writes = [
            _post(client),
            client.put(f"/api/claims/{train.pk}/", json.dumps({"name": "train", "count": 3}), content_type="application/json"),
            client.delete(f"/api/claims/{train.pk}/"),
        ]
        assert [w.status_code for w in writes] == [403, 403, 403]
        assert writes[0].json()["error"] == {"code": "forbidden", "message": "this API token may only read"}
    assert list(Claim.objects.values_list("name", "count")) == [("train", 1)]


def test_it_keeps_the_role_rules_for_a_read_write_token(viewer, outsider, alpha):
    response = _post(bearer(viewer))
    assert response.status_code == 403
    assert response.json()["error"] == {"code": "forbidden", "message": "you are in no team, so you may read claims but not book or change them"}
    assert bearer(outsider).get("/api/nodes/").status_code == 403
    assert not Claim.objects.exists()


def test_it_answers_a_revoked_token_with_401(viewer, alpha):
    token, secret = ApiToken.issue(viewer, "old", "read")
    client = Client(headers={"authorization": f"Bearer {secret}"})
    assert client.get("/api/nodes/").status_code == 200
    token.revoke(viewer)
    response = client.get("/api/nodes/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "bad_token"


def test_it_answers_an_unknown_token_with_401_even_with_a_session(viewer_client, alpha):
    response = viewer_client.get("/api/nodes/", headers={"authorization": "Bearer gpf_not-a-token"})
    assert response.status_code == 401
    assert response.json()["error"] == {"code": "bad_token", "message": "the API token is unknown or revoked"}


def test_it_stops_working_when_the_user_is_deactivated(viewer, alpha):
    client = bearer(viewer, "read")
    viewer.is_active = False
    viewer.save()
    assert client.get("/api/nodes/").status_code == 401


def test_it_notes_when_a_token_was_last_used_at_most_once_a_minute(viewer, alpha, django_assert_num_queries):
    token, secret = ApiToken.issue(viewer, "ci", "read")
    client = Client(headers={"authorization": f"Bearer {secret}"})
    assert token.last_used_at is None
    client.get("/api/nodes/")
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None and timezone.now() - first < timedelta(seconds=5)
    # token + user, user perms, group perms, count, page: no write this time
    with django_assert_num_queries(5):
        client.get("/api/nodes/")
    token.refresh_from_db()
    assert token.last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    client.get("/api/nodes/")
    token.refresh_from_db()
    assert token.last_used_at > first


@pytest.mark.parametrize("nodes", [1, 7])
def test_it_lists_nodes_in_fixed_queries_with_a_token(viewer, django_assert_num_queries, nodes):
    for n in range(nodes):
        make_node(f"node-{n}", 2)
    client = bearer(viewer, "read")
    client.get("/api/nodes/")  # the first use writes last_used_at
    # token + user, user perms, group perms, count, page
    with django_assert_num_queries(5):
        response = client.get("/api/nodes/")
    assert len(response.json()["results"]) == nodes
