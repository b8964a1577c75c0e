"""The claims API's quota answers: 409 quota_exceeded naming the quota, 403 for a reason to
book over quota from anyone but an admin, and an admin's reason taken and answered."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpufleet.claims.models import Claim
from tests.claims.helpers import TUESDAY_9, TUESDAY_17, booked_fixture, make_node, post_claim  # noqa: F401 (the booked fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]


def _put(client, claim: Claim, **body):
    body = {"name": claim.name, "count": 2, "starts_at": TUESDAY_9.isoformat(), "ends_at": TUESDAY_17.isoformat(),
            "updated_at": claim.updated_at.isoformat(), **body}
    return client.put(f"/api/claims/{claim.pk}/", json.dumps(body), content_type="application/json")


def test_a_change_over_the_teams_quota_is_409_naming_it(operator_client, booked):
    refused = _put(operator_client, booked, count=3)
    assert refused.status_code == 409
    assert refused.json() == {"error": {"code": "quota_exceeded", "message": (
        "The booking is over the team's quota of 2 GPUs at once: from Tue 8 Dec 09:00 UTC the team holds 0 and the"
        " booking asks 3 more; an admin may book over the quota, saying why.")}}


def test_a_reason_to_book_over_quota_from_an_operator_is_403_at_its_field(operator_client):
    make_node("alpha", 8)
    refused = post_claim(operator_client, {"name": "x", "count": 1, "quota_override_reason": "please"})
    assert refused.status_code == 403
    assert refused.json()["error"] == {"code": "forbidden", "field": "quota_override_reason",
                                       "message": "Only an admin may book over a team's quota."}
    assert not Claim.objects.exists()


def test_an_admin_books_over_quota_with_a_reason_the_claim_answers(admin_role_client, booked):
    saved = _put(admin_role_client, booked, count=4, ends_at=(TUESDAY_17 + timedelta(hours=1)).isoformat(),
                 quota_override_reason="the review deadline")
    assert saved.status_code == 200, saved.content
    assert saved.json()["quota_override_reason"] == "the review deadline"
    # A later change leaving the reason out keeps it.
    again = _put(admin_role_client, Claim.objects.get(pk=booked.pk), count=4, name="train-2",
                 ends_at=(TUESDAY_17 + timedelta(hours=1)).isoformat())
    assert again.status_code == 200 and again.json()["quota_override_reason"] == "the review deadline"
