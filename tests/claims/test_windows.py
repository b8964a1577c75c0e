"""A claim is a window of time: booked ahead through the form, held only within its
window, refused where it meets another claim's GPUs, and "now" is the claims in force."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.usage import idle
from gpufleet.usage.report import report
from tests.claims.helpers import all_errors, field_errors, make_node, summary, uuid
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)  # a Monday
TUESDAY_9 = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)
THURSDAY_17 = datetime(2026, 12, 10, 17, 0, tzinfo=UTC)


def local(moment: datetime) -> str:
    """As a datetime-local input sends it (the site's zone is UTC in the tests)."""
    return moment.strftime("%Y-%m-%dT%H:%M")


def book(client, node: Node, name: str, start: datetime | None, end: datetime | None, gpus=(3,)):
    return client.post(f"/claims/nodes/{node.name}/new/", {
        "name": name, "mode": "devices", "devices": [uuid(node, i) for i in gpus],
        "starts_at": local(start) if start else "", "ends_at": local(end) if end else "",
    })


@pytest.fixture
def monday():
    with time_machine.travel(NOW, tick=False) as traveller:
        yield traveller


def test_a_gpu_booked_ahead_is_refused_over_the_booking_naming_it_and_accepted_outside(operator_client, monday):
    node = make_node("alpha", 8)
    assert book(operator_client, node, "train-llm", TUESDAY_9, THURSDAY_17).status_code == 302
    saved = Claim.objects.get(name="train-llm")
    assert (saved.starts_at, saved.ends_at) == (TUESDAY_9, THURSDAY_17)

    refused = book(operator_client, node, "eval", TUESDAY_9 + timedelta(hours=3), THURSDAY_17 + timedelta(hours=1))
    assert refused.status_code == 200
    assert all_errors(refused.content.decode()) == {"devices": [
        f"GPU 3 ('{uuid(node, 3)}') is already reserved by train-llm from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC."]}
    assert not Claim.objects.filter(name="eval").exists()

    # Back to back, before and after: the windows are half-open, so both fit.
    assert book(operator_client, node, "before", NOW + timedelta(hours=1), TUESDAY_9).status_code == 302
    assert book(operator_client, node, "after", THURSDAY_17, None).status_code == 302
    assert set(Claim.objects.values_list("name", flat=True)) == {"train-llm", "before", "after"}


def test_an_open_ended_claim_now_is_refused_at_the_first_booking_in_its_way_and_told_when_to_end(
        operator_client, monday):
    node = make_node("alpha", 8)
    book(operator_client, node, "train-llm", TUESDAY_9, THURSDAY_17)
    book(operator_client, node, "later", THURSDAY_17 + timedelta(days=2), None)
    refused = book(operator_client, node, "notebook", None, None)
    assert field_errors(refused.content.decode(), "devices") == [
        f"GPU 3 ('{uuid(node, 3)}') is already reserved by train-llm from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC;"
        " it fits if it ends by Tue 8 Dec 09:00 UTC."]
    # Taking the offer: it ends when the booking starts.
    assert book(operator_client, node, "notebook", None, TUESDAY_9).status_code == 302
    assert Claim.objects.get(name="notebook").starts_at == NOW


def test_counts_fit_beside_bookings_at_every_instant(operator_client, monday):
    make_node("alpha", 4)
    for name, start, hours in (("a", TUESDAY_9, 10), ("b", TUESDAY_9 + timedelta(hours=10), 10)):
        response = operator_client.post("/claims/nodes/alpha/new/", {
            "name": name, "mode": "count", "count": "3", "starts_at": local(start),
            "ends_at": local(start + timedelta(hours=hours))})
        assert response.status_code == 302, all_errors(response.content.decode())
    # Over both bookings one GPU is left at every instant: the most at once is 3, not 6.
    fits = operator_client.post("/claims/nodes/alpha/new/", {
        "name": "c", "mode": "count", "count": "1", "starts_at": local(TUESDAY_9), "ends_at": local(THURSDAY_17)})
    assert fits.status_code == 302
    too_many = operator_client.post("/claims/nodes/alpha/new/", {"name": "d", "mode": "count", "count": "1"})
    assert field_errors(too_many.content.decode(), "count")[0].startswith(
        "Needs 1 GPU but only 0 of 4 are free from Tue 8 Dec 09:00 UTC beside a (from Tue 8 Dec 09:00 to")


@pytest.mark.parametrize("start, end, field, message", [
    (TUESDAY_9, TUESDAY_9 - timedelta(hours=1), "ends_at", "The end must come after the start."),
    (NOW - timedelta(hours=2), None, "starts_at", "The start is already past; leave it empty to start now."),
    (None, NOW - timedelta(hours=1), "ends_at", "The end is already past; leave it empty for a claim with no end."),
])
def test_a_bad_window_is_refused_at_its_field_and_nothing_saved(operator_client, monday, start, end, field, message):
    node = make_node("alpha", 8)
    refused = book(operator_client, node, "train", start, end)
    assert field_errors(refused.content.decode(), field) == [message]
    assert not Claim.objects.exists()


def test_the_node_page_shows_free_gpus_now_and_during_the_booking(operator_client, viewer_client, monday):
    node = make_node("alpha", 8)
    book(operator_client, node, "train-llm", TUESDAY_9, THURSDAY_17, gpus=(2, 3))
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert (summary(page)["reserved"], summary(page)["free"]) == ("0", "8")
    assert "claims-booked" in page
    monday.move_to(TUESDAY_9 + timedelta(hours=1))
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert (summary(page)["reserved"], summary(page)["free"]) == ("2", "6")
    monday.move_to(THURSDAY_17)
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert (summary(page)["reserved"], summary(page)["free"]) == ("0", "8")
    assert "claims-ended" in page


def test_in_force_is_one_rule_in_the_database_and_for_claims_read(operator_client, monday):
    node = make_node("alpha", 8)
    book(operator_client, node, "booked", TUESDAY_9, THURSDAY_17, gpus=(0,))
    book(operator_client, node, "open", None, None, gpus=(1,))
    book(operator_client, node, "short", None, NOW + timedelta(hours=1), gpus=(2,))
    for moment in (NOW, NOW + timedelta(hours=1), TUESDAY_9, THURSDAY_17 - timedelta(seconds=1), THURSDAY_17):
        in_db = set(Claim.objects.in_force(moment).values_list("name", flat=True))
        read = {c.name for c in Claim.objects.all() if c.in_force(moment)}
        assert in_db == read, moment
    assert set(Claim.objects.in_force(TUESDAY_9).values_list("name", flat=True)) == {"booked", "open"}
    assert set(Claim.objects.booked(NOW).values_list("name", flat=True)) == {"booked"}
    assert set(Claim.objects.ended(THURSDAY_17).values_list("name", flat=True)) == {"short", "booked"}
    assert set(Claim.objects.ended(TUESDAY_9).values_list("name", flat=True)) == {"short"}


def test_the_claims_list_filters_by_when(operator_client, viewer_client, monday):
    node = make_node("alpha", 8)
    book(operator_client, node, "booked", TUESDAY_9, THURSDAY_17, gpus=(0,))
    book(operator_client, node, "open", None, None, gpus=(1,))
    book(operator_client, node, "short", None, NOW + timedelta(hours=1), gpus=(2,))
    monday.move_to(NOW + timedelta(hours=2))

    def listed(state: str) -> set[str]:
        html = viewer_client.get("/claims/", {"state": state}).content.decode()
        return {name for name in ("booked", "open", "short") if f'<th scope="row">{name}</th>' in html}

    assert (listed("booked"), listed("now"), listed("ended")) == ({"booked"}, {"open"}, {"short"})


def _snapshot_at(traveller, moment: datetime) -> None:
    """alpha reports at `moment`, its GPUs quiet."""
    traveller.move_to(moment)
    assert ingest_snapshot(snapshot("alpha", 8, at=moment, util="0")).outcome == "accepted"


def test_a_booking_starts_and_ends_by_itself_for_ingest_placement_idle_and_usage(
        settings, operator_client, viewer_client, monday):
    settings.GPUFLEET_IDLE_HOURS = 1.0
    _snapshot_at(monday, NOW)
    node = Node.objects.get(name="alpha")
    made = operator_client.post("/claims/nodes/alpha/new/", {
        "name": "train-llm", "mode": "all", "starts_at": local(TUESDAY_9), "ends_at": local(THURSDAY_17)})
    assert made.status_code == 302
    _snapshot_at(monday, NOW + timedelta(minutes=5))

    def fits() -> list[str]:
        return [f["node"] for f in viewer_client.get("/api/placement", {"count": 8}).json()["fits"]]

    # Booked, not started: nothing reserved, the node takes 8 GPUs now, no reserved hours.
    assert Node.objects.get(pk=node.pk).gpus_reserved == 0
    assert fits() == ["alpha"]
    assert report(NOW - timedelta(hours=1), THURSDAY_17, "claim").total.reserved == 0

    # Started by itself: the next snapshot counts it, placement sees it, its hours accrue ...
    _snapshot_at(monday, TUESDAY_9 + timedelta(minutes=30))
    assert Node.objects.get(pk=node.pk).gpus_reserved == 8
    assert fits() == []
    assert report(NOW - timedelta(hours=1), THURSDAY_17, "claim").total.reserved > 0
    # ... and it is idle from its start (not from when it was booked, a day earlier).
    assert Claim.objects.get(name="train-llm").idle_since is None
    _snapshot_at(monday, TUESDAY_9 + timedelta(hours=1, minutes=30))
    assert Claim.objects.get(name="train-llm").idle_since == TUESDAY_9

    # Ended by itself: its GPUs are free at its end; an idle claim that ended is not told.
    _snapshot_at(monday, THURSDAY_17)
    assert Node.objects.get(pk=node.pk).gpus_reserved == 0
    assert fits() == ["alpha"]
    assert idle.run(THURSDAY_17).warned == []
    assert "idle since" not in viewer_client.get("/claims/").content.decode()


def test_the_list_and_the_node_page_show_each_claims_window(operator_client, viewer_client, monday):
    node = make_node("alpha", 8)
    book(operator_client, node, "train-llm", TUESDAY_9, THURSDAY_17)
    book(operator_client, node, "notebook", None, None, gpus=(1,))
    html = viewer_client.get("/claims/").content.decode()
    rows = {name: row for row in re.findall(r"<tr.*?</tr>", html, re.S)
            for name in re.findall(r'<th scope="row">([\w-]+)</th>', row)}
    assert "booked" in rows["train-llm"] and "starts in 21 h" in rows["train-llm"]
    assert "from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC" in rows["train-llm"]
    assert "from Mon 7 Dec 12:00 UTC, with no end" in rows["notebook"] and "booked" not in rows["notebook"]
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert "from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC" in page


def test_the_form_asks_for_a_start_and_an_end_in_the_sites_time_zone(operator_client, settings):
    make_node("alpha", 8)
    html = operator_client.get("/claims/nodes/alpha/new/").content.decode()
    for field in ("starts_at", "ends_at"):
        assert re.search(rf'<input type="datetime-local" name="{field}"', html), field
    assert "Times are the site&#x27;s (UTC)." in html


def test_a_window_longer_than_the_sites_limit_is_refused(operator_client, settings, monday):
    settings.GPUFLEET_MAX_RESERVATION_DAYS = 30
    node = make_node("alpha", 8)
    refused = book(operator_client, node, "long", TUESDAY_9, TUESDAY_9 + timedelta(days=30, minutes=1))
    assert field_errors(refused.content.decode(), "ends_at") == [
        "The window is longer than the site's limit of 30 days (GPUFLEET_MAX_RESERVATION_DAYS)."]
    assert book(operator_client, node, "long", TUESDAY_9, TUESDAY_9 + timedelta(days=30)).status_code == 302
