"""The bench's list content (gpufleet.tools.bench_lists): claims, events and audit rows
for a fleet, made in bulk and valid as the pages read them."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event
from gpufleet.fleet.models import Node
from gpufleet.tools.bench_lists import populate_lists
from tests.claims.helpers import make_node

pytestmark = [pytest.mark.django_db, pytest.mark.bench]


def test_it_fills_the_lists_of_a_fleet(viewer_client):
    make_node("alpha", 2)
    Node.objects.bulk_create(Node(name=f"bench-{i:05d}") for i in range(29))
    ids = list(Node.objects.order_by("name").values_list("id", flat=True))
    made = populate_lists(ids, say=lambda _: None)
    assert made == {"owners": 1, "claims": 10, "events": 25, "audit": 10}
    assert Claim.objects.count() == 10 and Event.objects.count() == 25 and AuditEntry.objects.count() == 10
    assert Claim.objects.filter(ends_at__isnull=False).exists()
    assert 0 < Event.objects.filter(closed_at__isnull=True).count() < 25
    for url in ("/claims/", "/events/", "/audit/", "/api/claims/", "/api/events/"):
        assert viewer_client.get(url).status_code == 200, url
    assert viewer_client.get("/api/events/").json()["count"] == 25
