"""Node maintenance: set on the node page and through the API, audited, ends on its
own; a node in maintenance takes no new claim, is left out of find-a-node and shows
a Maintenance chip on the overview instead of its health."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.claims.placement import fleet_placement
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Maintenance, Node
from tests.claims.helpers import claim
from tests.factories import ingest

pytestmark = pytest.mark.django_db


def _hours(n: float):
    return timezone.now() + timedelta(hours=n)


def test_it_starts_ends_and_is_audited(operator):
    node = ingest("alpha", 2)
    assert not maintenance.is_in_maintenance(node)
    maintenance.start(node, _hours(2), "swap PSU", operator)
    assert maintenance.is_in_maintenance(node)
    assert list(maintenance.nodes_in_maintenance()) == [node]
    maintenance.end(node, operator)
    assert not maintenance.is_in_maintenance(node)
    actions = list(AuditEntry.objects.filter(node_name="alpha").order_by("at", "id").values_list("action", "username"))
    assert actions == [("maintenance.start", "otto"), ("maintenance.end", "otto")]
    with pytest.raises(maintenance.MaintenanceError, match="not in maintenance"):
        maintenance.end(node, operator)


def test_it_ends_on_its_own_when_its_time_passed(operator):
    node = ingest("alpha", 2)
    maintenance.start(node, _hours(1), "firmware", operator)
    later = _hours(2)
    assert not maintenance.is_in_maintenance(node, later)
    assert list(maintenance.nodes_in_maintenance(later)) == []


def test_it_refuses_an_end_in_the_past_or_no_reason(operator):
    node = ingest("alpha", 2)
    with pytest.raises(maintenance.MaintenanceError, match="future"):
        maintenance.start(node, _hours(-1), "late", operator)
    with pytest.raises(maintenance.MaintenanceError, match="why"):
        maintenance.start(node, _hours(1), "  ", operator)
    assert not Maintenance.objects.exists()


def test_a_node_in_maintenance_takes_no_new_claim_but_keeps_its_own(operator):
    node = ingest("alpha", 4)
    kept = claim(node, "train", operator, count=1)
    maintenance.start(node, _hours(1), "swap PSU", operator)
    with pytest.raises(services.InMaintenance) as refused:
        claim(node, "eval", operator, count=1)
    assert refused.value.code == "maintenance"
    assert "in maintenance until" in refused.value.message and "swap PSU" in refused.value.message
    assert list(Claim.objects.values_list("name", flat=True)) == ["train"]
    # An existing claim can still be edited (released and changed by its holders).
    services.save_claim(node, gpu.Claim("train", count=2), operator, editing=kept,
                        expected_updated_at=kept.updated_at)


def test_find_a_node_leaves_a_node_in_maintenance_out(operator):
    alpha, bravo = ingest("alpha", 4), ingest("bravo", 4)
    maintenance.start(alpha, _hours(1), "swap PSU", operator)
    answer = fleet_placement(gpu.PlacementRequest(count=1))
    assert [f.name for f in answer.fits] == ["bravo"]
    assert [(r.name, r.code) for r in answer.ruled_out] == [("alpha", "maintenance")]
    # Once its time passed it takes work again.
    Maintenance.objects.filter(node=alpha).update(until=timezone.now() - timedelta(seconds=1))
    answer = fleet_placement(gpu.PlacementRequest(count=1))
    assert sorted(f.name for f in answer.fits) == ["alpha", "bravo"] and bravo.name == "bravo"


def test_the_flag_is_a_join_of_the_maintenance_row_not_a_subquery_per_node(operator):
    alpha, charlie = ingest("alpha", 1), ingest("charlie", 1)
    ingest("bravo", 1)
    maintenance.start(alpha, _hours(1), "swap PSU", operator)
    maintenance.start(charlie, _hours(1), "reseat GPU", operator)
    Maintenance.objects.filter(node=charlie).update(until=timezone.now() - timedelta(seconds=1))
    nodes = Node.objects.annotate(away=maintenance.in_maintenance_flag()).order_by("name")
    assert [(n.name, n.away) for n in nodes] == [("alpha", True), ("bravo", False), ("charlie", False)]
    # A subquery would run again for every node at each place a query reads the flag:
    # the overview's tiles read it five times over the whole fleet.
    sql = str(nodes.query).upper()
    assert "EXISTS" not in sql and "LEFT OUTER JOIN" in sql


def test_the_overview_shows_a_maintenance_chip_instead_of_its_health(viewer_client, operator):
    node = ingest("alpha", 0, attach="none", toolkit=None)  # failing: no GPU
    ingest("bravo", 2)
    maintenance.start(node, _hours(1), "swap PSU", operator)
    page = viewer_client.get("/").content.decode()
    row = page[page.index(">alpha</a></th>"):]
    row = row[: row.index("</tr>")]
    assert '<span class="badge badge-blue">Maintenance</span>' in row
    assert "badge-red" not in row
    # Not counted as failing: it was taken out of service on purpose.
    assert "1 in maintenance" in page


def test_the_node_page_sets_and_ends_it(operator_client):
    ingest("alpha", 2)
    until = timezone.localtime(_hours(3)).strftime("%Y-%m-%dT%H:%M")
    response = operator_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                    {"until": until, "reason": "swap PSU"}, follow=True)
    page = response.content.decode()
    assert "alpha is in maintenance until" in page
    assert "In maintenance until" in page and "swap PSU" in page and "End maintenance now" in page
    response = operator_client.post(reverse("fleet:end_maintenance", args=["alpha"]), follow=True)
    page = response.content.decode()
    assert "Maintenance of alpha ended." in page and "Put in maintenance" in page


def test_a_viewer_may_not_set_it(viewer_client):
    ingest("alpha", 2)
    response = viewer_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                  {"until": "2999-01-01T00:00", "reason": "x"})
    assert response.status_code == 403
    assert "Put in maintenance" not in viewer_client.get(reverse("fleet:node_detail", args=["alpha"])).content.decode()


def test_the_api_sets_reads_and_ends_it(operator_client, viewer_client):
    ingest("alpha", 2)
    url = "/api/nodes/alpha/maintenance/"
    assert viewer_client.get(url).json()["in_maintenance"] is False
    until = _hours(2).isoformat()
    response = operator_client.put(url, json.dumps({"until": until, "reason": "swap PSU"}),
                                   content_type="application/json")
    assert response.status_code == 200, response.content
    body = viewer_client.get(url).json()
    assert body["in_maintenance"] is True and body["reason"] == "swap PSU" and body["author"] == "otto"
    assert viewer_client.delete(url).status_code == 403
    assert operator_client.delete(url).status_code == 204
    assert operator_client.delete(url).status_code == 409
    bad = operator_client.put(url, json.dumps({"until": _hours(-1).isoformat(), "reason": "x"}),
                              content_type="application/json")
    assert bad.status_code == 422 and "future" in bad.json()["error"]["message"]
    assert operator_client.get("/api/nodes/nobody/maintenance/").status_code == 404


def test_an_operator_may_not_set_maintenance_past_the_longest_on_the_page_or_the_api(operator_client):
    ingest("alpha", 2)
    response = operator_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                    {"until": "9999-12-31T00:00", "reason": "forever"}, follow=True)
    page = response.content.decode()
    assert "Maintenance not set." in page and "longer than 30 days" in page and "admin role" in page
    response = operator_client.put("/api/nodes/alpha/maintenance/",
                                   json.dumps({"until": "9999-12-31T00:00:00Z", "reason": "forever"}),
                                   content_type="application/json")
    assert response.status_code == 403, response.content
    assert "longer than 30 days" in response.json()["error"]["message"]
    assert not Maintenance.objects.exists()
    # Within the longest, it is the operator's as before.
    response = operator_client.put("/api/nodes/alpha/maintenance/",
                                   json.dumps({"until": _hours(24 * 29).isoformat(), "reason": "rebuild"}),
                                   content_type="application/json")
    assert response.status_code == 200, response.content


def test_the_admin_role_sets_a_longer_maintenance_on_the_page_and_the_api(admin_role_client, settings):
    settings.GPUFLEET_MAINTENANCE_MAX_DAYS = 7
    ingest("alpha", 2)
    ingest("beta", 2)
    until = timezone.localtime(_hours(24 * 60)).strftime("%Y-%m-%dT%H:%M")
    response = admin_role_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                      {"until": until, "reason": "decommissioning"}, follow=True)
    assert "alpha is in maintenance until" in response.content.decode()
    response = admin_role_client.put("/api/nodes/beta/maintenance/",
                                     json.dumps({"until": "9999-12-31T00:00:00Z", "reason": "retired"}),
                                     content_type="application/json")
    assert response.status_code == 200, response.content
    assert Maintenance.objects.count() == 2
