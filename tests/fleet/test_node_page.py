"""The node page /nodes/<name>/: devices with holders and charts, vanished GPUs,
findings worst first with fixes, actions by role, and its findings fragment."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.fleet.tasks import roll_history
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.teams.models import Team
from tests.factories import hx, ingest, snapshot


@pytest.mark.django_db
def test_it_shows_devices_holders_and_charts(viewer_client, alpha):
    Claim.objects.create(node=alpha, name="train-llm", device_ids=["1"])
    response = viewer_client.get(reverse("fleet:node_detail", args=["alpha"]))
    page = response.content.decode()
    assert response.status_code == 200
    device = alpha.devices.get(index=1)
    assert device.uuid in page
    assert page.count('<svg class="spark"') == 8
    assert "<polyline" in page
    assert "train-llm" in page
    assert "1.0 / 140.4 GiB" in page  # VRAM bar with its value in text
    assert 'id="job-slot"' in page
    assert 'id="claims' in page  # the claims panel (templates/claims/node_claims.html) is included


@pytest.mark.django_db
def test_it_shows_vanished_gpus_as_vanished(viewer_client):
    ingest("alpha", 2)
    ingest("alpha", 1, at=timezone.now() + timedelta(seconds=5))
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert 'class="is-vanished"' in page
    assert '<span class="badge badge-red">Vanished</span>' in page


@pytest.mark.django_db
def test_it_greys_an_offline_node(viewer_client, alpha):
    Node.objects.filter(pk=alpha.pk).update(offline=True, last_seen=timezone.now() - timedelta(hours=2))
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert "Not reporting" in page and "last seen <time" in page and "2\xa0hours ago" in page
    assert '<span class="badge badge-grey">Offline</span>' in page
    assert "bar-muted" in page


@pytest.mark.django_db
def test_it_orders_findings_fail_warn_ok(viewer_client):
    # Full VRAM warns per GPU; no toolkit warns; CDI/runtime fail when nothing attaches.
    ingest("alpha", 2, used_mib=140000, attach="none", toolkit=None)
    findings = viewer_client.get("/nodes/alpha/findings/", **hx()).content.decode()
    statuses = [s for s in ("badge-red", "badge-amber", "badge-green") if s in findings]
    positions = [findings.find(s) for s in statuses]
    assert statuses[:2] == ["badge-red", "badge-amber"]
    assert positions == sorted(positions)
    assert findings.rfind("badge-red") < findings.find("badge-amber")
    assert findings.rfind("badge-amber") < findings.find("badge-green")


@pytest.mark.django_db
def test_it_shows_fixes_with_copy_buttons(viewer_client, alpha):
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert '<code class="fix-cmd" id="fix-cdi">sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml</code>' in page
    assert '<button type="button" class="copy" data-copy="fix-cdi">Copy</button>' in page
    assert '<script src="/static/gpufleet/copy.js" defer></script>' in page


@pytest.mark.django_db
def test_it_hides_actions_from_viewers(viewer_client, alpha):
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert "Diagnose now" not in page and "Apply fix" not in page


@pytest.mark.django_db
def test_it_shows_diagnose_to_operators_but_not_fixes(operator_client, alpha):
    page = operator_client.get("/nodes/alpha/").content.decode()
    assert 'hx-post="/nodes/alpha/diagnose/"' in page and 'action="/nodes/alpha/diagnose/"' in page
    assert "Apply fix" not in page


@pytest.mark.django_db
def test_it_shows_fix_buttons_to_admins_for_allowed_codes_only(admin_role_client, alpha):
    page = admin_role_client.get("/nodes/alpha/").content.decode()
    assert 'href="/nodes/alpha/fix/cdi/"' in page and 'hx-post="/nodes/alpha/fix/cdi/"' in page
    assert "hx-confirm=" in page
    assert "/fix/runtime/" not in page and "/fix/toolkit/" not in page


@pytest.mark.django_db
def test_it_sends_only_the_findings_to_htmx(viewer_client, alpha):
    response = viewer_client.get(reverse("fleet:node_findings", args=["alpha"]), **hx())
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="findings"')
    assert 'hx-trigger="findings-changed from:body, every 30s"' in body
    assert "<html" not in body and "spark" not in body
    assert "HX-Request" in response["Vary"]
    # Without HTMX the same URL is the whole node page.
    assert "<html" in viewer_client.get(reverse("fleet:node_findings", args=["alpha"])).content.decode()


@pytest.mark.django_db
def test_it_404s_for_unknown_nodes(viewer_client):
    assert viewer_client.get("/nodes/nope/").status_code == 404


def _with_history(name: str, gpus: int) -> None:
    start = timezone.now() - timedelta(hours=3)
    for i in range(4):
        ingest(name, gpus, at=start + timedelta(minutes=30 * i))
    roll_history()  # as the central beat does every five minutes


# session, user, permissions (user, groups), node, findings; the claims panel's
# own (devices, claims, the person's teams and the teams the form offers, recent claim
# changes; and the teams of its claims when any has one: CLAIM_TEAMS, no list of users: owned by the claims editor, so this number
# moves when that panel does); devices, the history of all its GPUs (the
# default 24 h: five-minute rollups, then the raw samples after them), recent jobs,
# the timeline's last events, the last DCGM diagnostic (its validation is joined to the node).
# Nothing per GPU.
NODE_PAGE_QUERIES = 16
CLAIM_TEAMS = 1


@pytest.mark.django_db
@pytest.mark.parametrize("gpus", [2, 8])
def test_it_reads_a_fixed_number_of_queries(admin_role_client, lab, django_assert_num_queries, gpus):
    _with_history("alpha", gpus)
    node = Node.objects.get(name="alpha")
    Claim.objects.create(node=node, team=lab, name="train", device_ids=["0"])
    Claim.objects.create(node=node, team=Team.objects.create(name="vision"), name="eval", device_ids=["1"])
    with django_assert_num_queries(NODE_PAGE_QUERIES + CLAIM_TEAMS):
        page = admin_role_client.get("/nodes/alpha/").content.decode()
    assert page.count('<svg class="spark"') == gpus


@pytest.mark.django_db
def test_its_cost_does_not_grow_with_the_history_stored(admin_role_client):
    """A node with an hour of history and one with 30 days read the same queries in
    every range (one history query from raw samples, two from rollups), and each
    chart gets at most a point per column (and the tail's) whatever is stored."""
    from gpufleet.fleet import charts, history
    from gpufleet.tools.backfill import add_history

    now = timezone.now()
    little, much = ingest("little", 2), ingest("much", 2)
    add_history(list(little.devices.all()), now, hours=1, every=timedelta(minutes=1))
    # 30 days stored: a sample every five minutes over the last 8 days, more than any range
    # reads, and one an hour before that, where only the hourly rollups are kept anyway.
    add_history(list(much.devices.all()), now - timedelta(days=8), hours=22 * 24, every=timedelta(hours=1))
    add_history(list(much.devices.all()), now, hours=8 * 24, every=timedelta(minutes=5))
    counts = {}
    for history_range, hours in charts.RANGES.items():
        span = timedelta(hours=hours)
        points = history.chart_samples(list(much.devices.all()), now - span, now)
        assert all(len(found) <= charts.BUCKETS + 2 for found in points.values()), history_range
        for name in ("little", "much"):
            with CaptureQueriesContext(connection) as ctx:
                page = admin_role_client.get(f"/nodes/{name}/", {"range": history_range}).content.decode()
            assert page.count("<polyline") >= 2
            counts[history_range, name] = len(ctx)
    assert counts["24h", "much"] == NODE_PAGE_QUERIES
    assert {counts[r, "little"] for r in ("1h", "6h")} == {counts[r, "much"] for r in ("1h", "6h")} == {NODE_PAGE_QUERIES - 1}
    assert {counts[r, "little"] for r in ("24h", "7d")} == {counts[r, "much"] for r in ("24h", "7d")} == {NODE_PAGE_QUERIES}


@pytest.mark.django_db
def test_a_node_whose_detection_fails_shows_its_last_known_gpus_as_lost(viewer_client):
    ten_minutes_ago = timezone.now() - timedelta(minutes=10)
    assert ingest_snapshot(snapshot("alpha", 8, at=ten_minutes_ago), now=ten_minutes_ago).outcome == "accepted"
    ingest("alpha", 0)  # nvidia-smi found nothing this time
    with CaptureQueriesContext(connection) as counted:
        page = viewer_client.get("/nodes/alpha/").content.decode()
    assert 'class="lost-gpus">8 GPUs last seen <time' in page and "10\xa0minutes ago</time>" in page
    assert page.count('class="is-vanished"') == 8
    assert len(counted) == _queries_of_a_healthy_node_page(viewer_client)  # no query of its own


def _queries_of_a_healthy_node_page(client) -> int:
    ingest("beta", 8)
    with CaptureQueriesContext(connection) as counted:
        client.get("/nodes/beta/")
    return len(counted)


@pytest.mark.django_db
def test_it_says_how_many_messages_were_refused_without_failing_the_node(viewer_client, alpha):
    from gpufleet.fleet.models import Refusal
    from gpufleet.ingest.refusals import count_refusals

    count_refusals({("alpha", Refusal.OVER_CAP): 40, ("alpha", Refusal.REPLAY): 2})
    page = viewer_client.get("/nodes/alpha/").content.decode()
    assert "42 messages refused since" in page
    assert "last " in page and "not newer than the stored snapshot" in page
    assert "Not reporting with a valid key" not in page
    assert Node.objects.get(name="alpha").status != "fail"


@pytest.mark.django_db
def test_a_node_without_refusals_says_nothing_of_them(viewer_client, alpha):
    assert "refused since" not in viewer_client.get("/nodes/alpha/").content.decode()


@pytest.mark.django_db
def test_it_reads_no_more_queries_with_refusals(admin_role_client, django_assert_num_queries):
    from gpufleet.fleet.models import Refusal
    from gpufleet.ingest.refusals import count_refusals

    _with_history("alpha", 2)
    Claim.objects.create(node=Node.objects.get(name="alpha"), name="train", device_ids=["0"])
    count_refusals({("alpha", Refusal.BAD_SIGNATURE): 3})
    with django_assert_num_queries(NODE_PAGE_QUERIES):
        page = admin_role_client.get("/nodes/alpha/").content.decode()
    assert "3 messages refused since" in page
