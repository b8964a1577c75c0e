"""A repeating booking through the claim form: Repeats (an RRULE with an end) books
every occurrence, or none with every conflict shown."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import TUESDAY_9, TUESDAY_17, all_errors, make_node, uuid

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("monday")]


def book(client, node: Node, name: str, start: datetime, end: datetime, repeat: str = "", url: str = ""):
    return client.post(url or f"/claims/nodes/{node.name}/new/", {
        "name": name, "mode": "devices", "devices": [uuid(node, 3)],
        "starts_at": start.strftime("%Y-%m-%dT%H:%M"), "ends_at": end.strftime("%Y-%m-%dT%H:%M"), "repeat": repeat,
    })


def test_the_form_books_every_tuesday_of_the_rule(operator_client):
    node = make_node("alpha", 8)
    page = operator_client.get(f"/claims/nodes/{node.name}/new/").content.decode()
    assert 'name="repeat"' in page and "FREQ=WEEKLY;BYDAY=TU;COUNT=12" in page
    assert book(operator_client, node, "lab", TUESDAY_9, TUESDAY_17, "FREQ=WEEKLY;BYDAY=TU;COUNT=4").status_code == 302
    rows = list(Claim.objects.order_by("starts_at"))
    assert [(c.name, c.starts_at) for c in rows] == [
        (f"lab-2026-12-{8 + 7 * w:02d}", TUESDAY_9 + timedelta(weeks=w)) for w in range(4)]
    assert len({c.series for c in rows}) == 1 and rows[0].series is not None


def test_the_form_refuses_a_series_meeting_a_booking_naming_both_and_saves_nothing(operator_client):
    node = make_node("alpha", 8)
    week_3 = TUESDAY_9 + timedelta(weeks=2)
    assert book(operator_client, node, "train-llm", week_3 + timedelta(hours=1), week_3 + timedelta(hours=2)).status_code == 302
    refused = book(operator_client, node, "lab", TUESDAY_9, TUESDAY_17, "FREQ=WEEKLY;COUNT=4")
    assert refused.status_code == 200
    errors = all_errors(refused.content.decode())
    assert list(errors) == ["repeat"]
    assert "1 of 4 occurrences do not fit" in errors["repeat"][0]
    assert "lab-2026-12-22" in errors["repeat"][0] and "reserved by train-llm from Tue 22 Dec 10:00" in errors["repeat"][0]
    assert list(Claim.objects.values_list("name", flat=True)) == ["train-llm"]


def test_the_form_refuses_a_rule_without_an_end_and_an_edit_has_no_repeats(operator_client):
    node = make_node("alpha", 8)
    refused = book(operator_client, node, "lab", TUESDAY_9, TUESDAY_17, "FREQ=WEEKLY")
    assert "needs an end" in all_errors(refused.content.decode())["repeat"][0]
    assert not Claim.objects.exists()
    assert book(operator_client, node, "one", TUESDAY_9, TUESDAY_17).status_code == 302
    edit = operator_client.get(f"/claims/{Claim.objects.get().pk}/edit/").content.decode()
    assert 'name="repeat"' not in edit
