"""The claims API takes and answers a claim's window (starts_at, ends_at, ISO 8601 with
a time zone), and refuses a booking that meets another's GPUs, naming it and its window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.claims.models import Claim
from tests.claims.helpers import NOW, TUESDAY_9, make_node, post_claim

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]

THURSDAY_17 = datetime(2026, 12, 10, 17, 0, tzinfo=UTC)


def _book(client, name, start, end, gpus=("3",)):
    return post_claim(client, {"name": name, "device_ids": list(gpus), "starts_at": start and start.isoformat(),
                               "ends_at": end and end.isoformat()})


def test_a_booking_is_stored_and_answered_with_its_window(operator_client, viewer_client):
    make_node("alpha", 8)
    made = _book(operator_client, "train-llm", TUESDAY_9, THURSDAY_17)
    assert made.status_code == 201
    body = made.json()
    assert (body["starts_at"], body["ends_at"], body["in_force"], body["ended"]) == (
        TUESDAY_9.isoformat(), THURSDAY_17.isoformat(), False, False)
    assert viewer_client.get(f"/api/claims/{body['id']}/").json()["starts_at"] == TUESDAY_9.isoformat()
    # Not held now: the node's ledger has every GPU free.
    assert viewer_client.get("/api/nodes/alpha/claims/").json()["ledger"]["free"] == 8


def test_an_overlapping_booking_is_409_naming_the_first_and_a_later_one_fits(operator_client):
    make_node("alpha", 8)
    _book(operator_client, "train-llm", TUESDAY_9, THURSDAY_17)
    refused = _book(operator_client, "eval", TUESDAY_9 - timedelta(hours=2), TUESDAY_9 + timedelta(hours=1))
    assert refused.status_code == 409
    assert refused.json()["error"] == {
        "code": "device_taken",
        "message": "GPU 3 ('3') is already reserved by train-llm from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC;"
                   " it fits if it ends by Tue 8 Dec 09:00 UTC.",
        "ends_by": TUESDAY_9.isoformat(),
    }
    assert _book(operator_client, "eval", THURSDAY_17, THURSDAY_17 + timedelta(days=1)).status_code == 201


def _put(client, pk, body):
    version = Claim.objects.get(pk=pk).updated_at.isoformat()
    return client.put(f"/api/claims/{pk}/", json.dumps({**body, "updated_at": version}),
                      content_type="application/json")


def test_a_put_moves_the_window_and_keeps_what_it_leaves_out(operator_client):
    make_node("alpha", 8)
    pk = _book(operator_client, "train-llm", TUESDAY_9, THURSDAY_17).json()["id"]
    later = TUESDAY_9 + timedelta(hours=1)
    moved = _put(operator_client, pk, {"name": "train-llm", "device_ids": ["3"], "starts_at": later.isoformat()}).json()
    assert (moved["starts_at"], moved["ends_at"]) == (later.isoformat(), THURSDAY_17.isoformat())
    kept = _put(operator_client, pk, {"name": "train-llm", "device_ids": ["2"]}).json()
    assert (kept["starts_at"], kept["ends_at"], kept["device_ids"]) == (later.isoformat(), THURSDAY_17.isoformat(), ["2"])


@pytest.mark.parametrize("body, field", [
    ({"starts_at": "2026-12-08T09:00:00"}, "starts_at"),
    ({"ends_at": "2026-12-08T09:00"}, "ends_at"),
])
def test_a_time_without_a_zone_is_refused(operator_client, body, field):
    make_node("alpha", 8)
    response = post_claim(operator_client, {"name": "train", "count": 1, **body})
    assert response.status_code == 422
    assert "time zone" in json.dumps(response.json())
    assert not Claim.objects.exists()


def test_an_end_before_the_start_is_refused_at_ends_at(operator_client):
    make_node("alpha", 8)
    response = _book(operator_client, "train", THURSDAY_17, TUESDAY_9)
    assert response.status_code == 422
    assert response.json()["error"] == {"code": "invalid", "message": "The end must come after the start.",
                                        "field": "ends_at"}


def test_an_edit_of_a_claim_in_force_is_not_judged_against_claims_that_ended(operator_client, monday):
    make_node("alpha", 4)
    pk = post_claim(operator_client, {"name": "train", "count": 1}).json()["id"]
    assert post_claim(operator_client, {"name": "short", "count": 3,
                                        "ends_at": (NOW + timedelta(hours=1)).isoformat()}).status_code == 201
    monday.move_to(NOW + timedelta(hours=2))
    grown = _put(operator_client, pk, {"name": "train", "count": 4})
    assert grown.status_code == 200, grown.json()
    assert grown.json()["starts_at"] == NOW.isoformat()
