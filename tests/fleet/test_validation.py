"""A node in validation (after maintenance): it takes no new claim, refused the way
maintenance refuses one (gpufleet/fleet/maintenance.py closed_to_claims), and find-a-node
leaves it out, until a DCGM diagnostic of the level asked for passes; an admin may end
it by hand. Every change is audited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.placement import fleet_placement
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Node, Validation
from gpufleet.gpu.dcgm import DcgmInfo
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import JobStatus
from tests.claims.helpers import claim
from tests.factories import hx, ingest, snapshot
from tests.fakes.recorded import recording
from tests.fleet.test_overview import TABLE_QUERIES

pytestmark = pytest.mark.django_db


@pytest.fixture
def alpha(db):
    snap = snapshot("alpha", 2)
    snap["dcgm"] = DcgmInfo(True, "4.4.2").to_dict()
    ingest_snapshot(snap)
    return Node.objects.get(name="alpha")


def _run(node, level: int, user, recorded: str) -> None:
    job = jobs.request_dcgm_diag(node, level, user)
    jobs.report_progress(job.pk, JobStatus.RUNNING, node=node.name)
    jobs.report_progress(job.pk, JobStatus.DONE, recording(f"dcgmi/{recorded}"), node=node.name)


def test_maintenance_set_on_the_page_can_ask_for_validation_after_it(operator_client, alpha):
    until = (timezone.localtime() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    response = operator_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                    {"until": until, "reason": "swap a GPU", "validate": "2"})
    assert response.status_code == 302
    row = Validation.objects.get(node=alpha)
    assert (row.level, row.reason, row.author.username) == (2, "after maintenance: swap a GPU", "otto")
    actions = list(AuditEntry.objects.filter(node_name="alpha").order_by("id").values_list("action", flat=True))
    assert actions == ["maintenance.start", "validation.start"]
    page = operator_client.get("/nodes/alpha/").content.decode()
    assert "In validation" in page and "until a DCGM diagnostic -r 2 (or higher) passes" in page
    assert "End validation without a run" not in page  # the admins' override


def test_a_node_in_validation_takes_no_new_claim_once_maintenance_is_over(operator, alpha):
    maintenance.start(alpha, timezone.now() + timedelta(hours=1), "firmware", operator, validate_level=1)
    with pytest.raises(services.InMaintenance) as during:
        claim(alpha, "train", count=1)
    assert during.value.code == "maintenance"
    maintenance.end(alpha, operator)
    with pytest.raises(services.InMaintenance) as after:
        claim(alpha, "train", count=1)
    assert after.value.code == "validation"
    assert "takes no new claim until a DCGM diagnostic -r 1 passes" in after.value.message
    [ruled_out] = fleet_placement(gpu.PlacementRequest(count=1)).ruled_out
    assert (ruled_out.name, ruled_out.code) == ("alpha", "validation")


def test_the_api_refuses_a_claim_on_a_node_in_validation_with_its_code(admin_role_client, admin_user, alpha):
    maintenance.start_validation(alpha, 1, "new GPU", admin_user)
    response = admin_role_client.post("/api/nodes/alpha/claims/", {"name": "train", "count": 1},
                                      content_type="application/json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "validation"


def test_a_passing_run_of_the_level_asked_ends_validation(admin_user, alpha, sent_tasks):
    maintenance.start_validation(alpha, 2, "after maintenance", admin_user)
    _run(alpha, 1, admin_user, "diag-r1-pass-3.1.0.json")  # a lower level does not validate
    assert Validation.objects.filter(node=alpha).exists()
    _run(alpha, 2, admin_user, "diag-r2-fail-3.3.8-h100.json")  # nor a failed run
    assert Validation.objects.filter(node=alpha).exists()
    _run(alpha, 2, admin_user, "diag-r2-pass-4.4.2.json")
    assert not Validation.objects.filter(node=alpha).exists()
    end = AuditEntry.objects.get(action="validation.end")
    assert end.username == "" and end.after["why"].startswith("DCGM diagnostic -r 2 passed (job ")
    assert claim(alpha, "train", count=1).name == "train"


def test_only_admins_end_validation_without_a_run(operator_client, admin_role_client, admin_user, alpha):
    maintenance.start_validation(alpha, 1, "", admin_user)
    url = reverse("fleet:end_validation", args=["alpha"])
    assert operator_client.post(url).status_code == 403
    assert Validation.objects.filter(node=alpha).exists()
    assert "End validation without a run" in admin_role_client.get("/nodes/alpha/").content.decode()
    assert admin_role_client.post(url).status_code == 302
    assert not Validation.objects.filter(node=alpha).exists()
    assert AuditEntry.objects.filter(action="validation.end", username="ada", after={"why": "ended by hand"}).exists()
    with pytest.raises(maintenance.MaintenanceError, match="not in validation"):
        maintenance.end_validation(alpha, admin_user)


def _row(page: str, name: str) -> str:
    """The overview table's row of node `name`."""
    row = page[page.index(f">{name}</a></th>"):]
    return row[: row.index("</tr>")]


CHIP = '<span class="badge badge-amber">In validation</span>'


def test_the_overview_shows_an_in_validation_chip_beside_its_health(viewer_client, admin_user, operator, alpha):
    bravo = ingest("bravo", 2)
    ingest("charlie", 2)
    maintenance.start_validation(alpha, 2, "new GPU", admin_user)
    maintenance.start(bravo, timezone.now() + timedelta(hours=1), "swap PSU", operator, validate_level=1)
    page = viewer_client.get("/").content.decode()
    # Back in service, so its health still shows: only new claims wait for the diagnostic.
    row = _row(page, "alpha")
    assert CHIP in row and "until DCGM -r 2 passes" in row
    assert '<span class="badge badge-green">OK</span>' in row
    # In maintenance first, then in validation.
    row = _row(page, "bravo")
    assert row.index('<span class="badge badge-blue">Maintenance</span>') < row.index(CHIP)
    assert "until DCGM -r 1 passes" in row
    assert CHIP not in _row(page, "charlie")
    maintenance.end_validation(alpha, admin_user)
    assert CHIP not in _row(viewer_client.get("/").content.decode(), "alpha")


def test_the_overview_reads_validation_in_its_table_query_not_one_per_node(viewer_client, admin_user, operator,
                                                                         make_fleet, django_assert_num_queries):
    nodes = make_fleet(30)
    for node in nodes[::2]:
        maintenance.start_validation(node, 1, "", admin_user)
    for node in nodes[::3]:
        maintenance.start(node, timezone.now() + timedelta(hours=1), "firmware", operator)
    with django_assert_num_queries(TABLE_QUERIES):
        response = viewer_client.get("/?per=200", **hx())
    assert response.content.decode().count(CHIP) == 15
