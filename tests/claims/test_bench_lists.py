"""The bench's list content (gpufleet.tools.bench_lists): claims, bookings ahead, events
and audit rows for a fleet, made in bulk and valid as the pages read them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.tools.bench_lists import BOOKING_DAYS, populate_lists
from tests.factories import snapshot

pytestmark = [pytest.mark.django_db, pytest.mark.bench]


@pytest.fixture
def fleet() -> list[int]:
    """30 nodes of 8 GPUs, in the order the bench passes them (by name)."""
    results = ingest_snapshots([snapshot(f"bench-{i:05d}", 8) for i in range(30)])
    assert {r.outcome for r in results} == {"accepted"}
    return list(Node.objects.order_by("name").values_list("id", flat=True))


def test_it_fills_the_lists_of_a_fleet(viewer_client, fleet):
    made = populate_lists(fleet, say=lambda _: None)
    assert made == {"owners": 1, "claims": 10, "bookings": 23, "events": 25, "audit": 33}
    assert Claim.objects.count() == 33 and Event.objects.count() == 25 and AuditEntry.objects.count() == 33
    assert Claim.objects.filter(ends_at__isnull=False, ends_at__lt=datetime.now(UTC)).exists()
    assert 0 < Event.objects.filter(closed_at__isnull=True).count() < 25
    for url in ("/claims/", "/events/", "/audit/", "/api/claims/", "/api/events/"):
        assert viewer_client.get(url).status_code == 200, url
    assert viewer_client.get("/api/events/").json()["count"] == 25


def test_it_books_a_third_of_the_fleet_ahead_within_the_horizon_without_overlaps(viewer_client, fleet):
    now = datetime.now(UTC)
    populate_lists(fleet, say=lambda _: None, now=now)
    ahead = Claim.objects.booked(now)
    assert ahead.count() == 23
    assert {node_id for node_id in ahead.values_list("node_id", flat=True)} == {
        node_id for position, node_id in enumerate(fleet) if position % 6 in (1, 5)}
    assert not ahead.filter(ends_at__gt=now + timedelta(days=BOOKING_DAYS)).exists()
    assert ahead.exclude(device_ids=[]).exists() and ahead.filter(device_ids=[]).exists()
    for node in Node.objects.all():
        claims = list(node.claims.all())
        assert node.ledger(claims=claims).overlaps() == [], node.name
    # The node whose page the bench times shows its bookings.
    node = Node.objects.get(name="bench-00007")
    page = viewer_client.get(f"/nodes/{node.name}/").content.decode()
    assert all(name in page for name in node.claims.values_list("name", flat=True))
