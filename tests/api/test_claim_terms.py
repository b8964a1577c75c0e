"""The claims API's owner, contact and end, and the list's owner and state filters."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def _post(client, body):
    return client.post("/api/nodes/alpha/claims/", json.dumps(body), content_type="application/json")


def _put(client, pk: int, body):
    """A replacement sent at the claim's version as stored now (as a client that just read it)."""
    body = {**body, "updated_at": Claim.objects.get(pk=pk).updated_at.isoformat()}
    return client.put(f"/api/claims/{pk}/", json.dumps(body), content_type="application/json")


def test_a_new_claim_is_the_callers_unless_another_owner_is_named(operator_client, operator, viewer, lab):
    lab.memberships.create(user=viewer)  # an owner is a member of the claim's team
    make_node("alpha", 8)
    mine = _post(operator_client, {"name": "mine", "count": 1}).json()
    assert (mine["owner"], mine["contact"], mine["ends_at"], mine["ended"], mine["in_force"]) == ("otto", "", None, False, True)
    theirs = _post(operator_client, {"name": "theirs", "count": 1, "owner": "vera", "contact": "#ml"}).json()
    assert (theirs["owner"], theirs["created_by"], theirs["contact"]) == ("vera", "otto", "#ml")
    nobody = _post(operator_client, {"name": "nobody", "count": 1, "owner": None}).json()
    assert nobody["owner"] is None


def test_an_end_is_stored_and_given_back(operator_client):
    make_node("alpha", 8)
    when = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    body = _post(operator_client, {"name": "train", "count": 1, "ends_at": when.isoformat()}).json()
    assert body["ends_at"] == when.isoformat()
    assert Claim.objects.get(name="train").ends_at == when


@pytest.mark.parametrize(
    "extra, field",
    [({"owner": "ghost"}, "owner"), ({"ends_at": "2001-01-01T00:00:00+00:00"}, "ends_at"),
     ({"contact": "a\u202eb"}, "contact")],
)
def test_bad_terms_are_422_and_save_nothing(operator_client, extra, field):
    make_node("alpha", 8)
    response = _post(operator_client, {"name": "train", "count": 1, **extra})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid"
    if field:
        assert response.json()["error"]["field"] == field
    assert not Claim.objects.exists()


def test_put_keeps_the_terms_it_leaves_out(operator_client, operator):
    node = make_node("alpha", 8)
    pk = _post(operator_client, {"name": "train", "count": 1, "contact": "#ml"}).json()["id"]
    body = _put(operator_client, pk, {"name": "train", "count": 2}).json()
    assert (body["count"], body["owner"], body["contact"]) == (2, "otto", "#ml")
    cleared = _put(operator_client, pk, {"name": "train", "count": 2, "contact": "", "owner": None}).json()
    assert (cleared["owner"], cleared["contact"]) == (None, "")
    assert node.claims.count() == 1


def test_the_list_filters_by_owner_and_state(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "forever", operator, count=1)
    old = claim(node, "old", operator, count=1)
    Claim.objects.filter(pk=old.pk).update(ends_at=timezone.now() - timedelta(hours=1))

    def names(**params):
        return [c["name"] for c in viewer_client.get("/api/claims/", params).json()["results"]]

    assert names(state="ended") == ["old"]
    assert names(state="now") == ["forever"]
    assert names(owner="otto") == ["forever", "old"]
    assert names(owner="vera") == []
    bad = viewer_client.get("/api/claims/", {"state": "soon"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_filter"
