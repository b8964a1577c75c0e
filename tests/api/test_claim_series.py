"""A repeating booking through the claims API: `repeat` (an RRULE with an end) saves one
claim per occurrence sharing a series, or refuses the lot listing every conflict."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from tests.claims.helpers import TUESDAY_9, TUESDAY_17, make_node, post_claim

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]


def _lab(client, repeat, **extra):
    return post_claim(client, {"name": "lab", "device_ids": ["0", "1"], "starts_at": TUESDAY_9.isoformat(),
                               "ends_at": TUESDAY_17.isoformat(), "repeat": repeat, **extra})


def test_a_weekly_series_of_four_is_saved_as_four_claims(operator_client, viewer_client):
    make_node("alpha", 8)
    made = _lab(operator_client, "FREQ=WEEKLY;BYDAY=TU;COUNT=4")
    assert made.status_code == 201
    body = made.json()
    assert [(c["name"], c["starts_at"], c["ends_at"]) for c in body["results"]] == [
        (f"lab-2026-12-{8 + 7 * w:02d}", (TUESDAY_9 + timedelta(weeks=w)).isoformat(),
         (TUESDAY_17 + timedelta(weeks=w)).isoformat()) for w in range(4)
    ]
    rows = Claim.objects.filter(node__name="alpha").order_by("starts_at")
    assert rows.count() == 4 and {str(r.series) for r in rows} == {body["series"]}
    assert {c["series"] for c in body["results"]} == {body["series"]}
    assert AuditEntry.objects.filter(action="claim.create").count() == 4
    listed = viewer_client.get("/api/nodes/alpha/claims/").json()["results"]
    assert [c["name"] for c in listed] == ["lab-2026-12-08", "lab-2026-12-15", "lab-2026-12-22", "lab-2026-12-29"]


def test_a_series_meeting_a_booking_is_refused_naming_the_occurrence_and_the_booking_and_nothing_is_saved(operator_client):
    make_node("alpha", 8)
    week_3 = TUESDAY_9 + timedelta(weeks=2)
    booked = post_claim(operator_client, {"name": "train-llm", "device_ids": ["1"], "starts_at": (week_3 + timedelta(hours=3)).isoformat(),
                                          "ends_at": (week_3 + timedelta(hours=30)).isoformat()})
    assert booked.status_code == 201
    audited = AuditEntry.objects.count()
    refused = _lab(operator_client, "FREQ=WEEKLY;COUNT=4")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "series_conflict"
    assert error["conflicts"] == [{
        "name": "lab-2026-12-22",
        "starts_at": "2026-12-22T09:00:00+00:00",
        "ends_at": "2026-12-22T17:00:00+00:00",
        "code": "device_taken",
        "message": "GPU 1 ('1') is already reserved by train-llm from Tue 22 Dec 12:00 to Wed 23 Dec 15:00 UTC;"
                   " it fits if it ends by Tue 22 Dec 12:00 UTC.",
    }]
    assert "1 of 4 occurrences" in error["message"] and "train-llm" in error["message"]
    assert list(Claim.objects.values_list("name", flat=True)) == ["train-llm"]
    assert AuditEntry.objects.count() == audited


@pytest.mark.parametrize(("repeat", "extra", "problem"), [
    ("FREQ=WEEKLY;BYDAY=TU", {}, "needs an end"),
    ("FREQ=DAILY;COUNT=500", {}, "at most 200"),
    ("FREQ=WEEKLY;COUNT=4", {"ends_at": None}, "needs an end"),
])
def test_a_rule_without_an_end_or_too_many_occurrences_is_refused_and_nothing_saved(operator_client, repeat, extra, problem):
    make_node("alpha", 8)
    refused = _lab(operator_client, repeat, **extra)
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["code"] == "invalid" and problem in error["message"]
    assert error["field"] == ("repeat" if not extra else "ends_at")
    assert not Claim.objects.exists()


def test_an_occurrence_is_changed_on_its_own_and_a_repeat_is_refused_on_a_change(operator_client):
    make_node("alpha", 8)
    first = _lab(operator_client, "FREQ=WEEKLY;COUNT=2").json()["results"][0]
    body = {"name": first["name"], "device_ids": ["2"], "updated_at": first["updated_at"]}
    refused = operator_client.put(f"/api/claims/{first['id']}/", json.dumps({**body, "repeat": "FREQ=DAILY;COUNT=2"}),
                                  content_type="application/json")
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "repeat"
    changed = operator_client.put(f"/api/claims/{first['id']}/", json.dumps(body), content_type="application/json")
    assert changed.status_code == 200 and changed.json()["device_ids"] == ["2"]
    assert sorted(Claim.objects.values_list("device_ids", flat=True)) == [["0", "1"], ["2"]]
