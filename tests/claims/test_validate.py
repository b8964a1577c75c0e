"""The inline validation endpoint: the form fragment with the ledger's verdict,
always 200 (htmx 2 swaps no 4xx body), storing nothing."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from tests.claims.helpers import HTMX, all_errors, claim, field_errors, make_node, uuid

pytestmark = pytest.mark.django_db


def test_it_returns_the_form_fragment_with_errors_and_status_200(operator_client, operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=2)
    response = operator_client.post(
        "/claims/nodes/alpha/validate/", {"name": "job", "mode": "count", "count": "1", "in_panel": "1"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<form id="claim-form"')
    assert "<html" not in html and "<body" not in html
    assert "HX-Request" in response["Vary"]
    assert field_errors(html, "count") == ["Needs 1 GPU but only 0 of 2 are free."]
    # The re-rendered form still posts to the panel and to this endpoint.
    assert 'hx-post="/claims/nodes/alpha/new/"' in html
    assert 'hx-post="/claims/nodes/alpha/validate/"' in html
    assert 'hx-trigger="change, keyup changed delay:300ms"' in html
    # Only the newest check may paint its errors (an older answer never lands last).
    assert 'hx-sync="closest form:replace"' in html


def test_it_stores_nothing_for_a_claim_that_fits(operator_client):
    make_node("alpha", 2)
    response = operator_client.post(
        "/claims/nodes/alpha/validate/", {"name": "job", "mode": "count", "count": "1"}, **HTMX
    )
    assert response.status_code == 200
    assert all_errors(response.content.decode()) == {}
    assert not Claim.objects.exists()
    assert not AuditEntry.objects.exists()


def test_it_validates_an_edit_against_the_other_claims_only(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, device_ids=[uuid(node, 0), uuid(node, 1)])
    claim(node, "eval", operator, device_ids=[uuid(node, 3)])
    url = f"/claims/{train.pk}/validate/"
    version = train.updated_at.isoformat()
    keep_own = {
        "name": "train",
        "mode": "devices",
        "devices": [uuid(node, 0), uuid(node, 1), uuid(node, 2)],
        "updated_at": version,
    }
    response = operator_client.post(url, keep_own, **HTMX)
    assert all_errors(response.content.decode()) == {}, "a claim must not collide with itself"
    take_other = {"name": "train", "mode": "devices", "devices": [uuid(node, 0), uuid(node, 3)], "updated_at": version}
    response = operator_client.post(url, take_other, **HTMX)
    assert all_errors(response.content.decode()) == {
        "devices": [f"GPU 3 ('{uuid(node, 3)}') is already reserved by eval."]
    }


def test_it_only_takes_posts(operator_client):
    make_node("alpha", 2)
    assert operator_client.get("/claims/nodes/alpha/validate/").status_code == 405


def test_it_is_404_for_an_unknown_node(operator_client):
    response = operator_client.post("/claims/nodes/nope/validate/", {"name": "x", "mode": "all"}, **HTMX)
    assert response.status_code == 404
