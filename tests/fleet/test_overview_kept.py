"""The overview's summary (tiles, fleet findings, the driver select's versions) is a kept
figure: computed at most once per GPUFLEET_SUMMARY_MAX_AGE_S and shared through Django's
cache by every view and poll, so many open overviews do not each scan the fleet. What the
site itself changes (a maintenance window, an Xid acknowledged, a claim) drops it at once."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Node
from gpufleet.fleet.xid_acks import acknowledge_xids
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import hx, ingest, snapshot

pytestmark = pytest.mark.django_db


def _summary(client) -> str:
    return client.get(reverse("fleet:summary"), **hx()).content.decode()


def _online(html: str) -> str:
    """The "Nodes online" tile's figure, as "2 / 3"."""
    tile = html.split("Nodes online</span>")[1]
    return tile.split('class="tile-value">')[1].split("</span>")[0].replace("<small>", "").replace("</small>", "")


def test_views_within_the_max_age_share_one_summary_and_the_table_stays_live(viewer_client, settings):
    settings.GPUFLEET_SUMMARY_MAX_AGE_S = 5
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        ingest("alpha", 2)
        assert _online(viewer_client.get("/").content.decode()) == "1 / 1"
        ingest("bravo", 2, driver="550.54.15")
        clock.shift(4)
        page = viewer_client.get("/").content.decode()
        assert _online(page) == "1 / 1" and _online(_summary(viewer_client)) == "1 / 1"
        assert '<option value="550.54.15">' not in page  # the driver select's versions are kept too
        assert ">bravo</a></th>" in page  # the table is read at each view
        clock.shift(2)
        page = viewer_client.get("/").content.decode()
        assert _online(page) == "2 / 2" and '<option value="550.54.15">' in page


def test_it_says_when_its_figures_were_computed(viewer_client, settings):
    settings.GPUFLEET_SUMMARY_MAX_AGE_S = 5
    start = timezone.now().replace(microsecond=0)
    with time_machine.travel(start, tick=False) as clock:
        ingest("alpha", 2)
        viewer_client.get("/")
        clock.shift(3)
        html = _summary(viewer_client)
    as_of = timezone.localtime(start)
    assert f'as of <time datetime="{as_of.isoformat()}">{as_of:%H:%M:%S}</time>' in html


def test_a_max_age_of_zero_keeps_nothing(viewer_client, settings):
    settings.GPUFLEET_SUMMARY_MAX_AGE_S = 0
    ingest("alpha", 2)
    assert _online(_summary(viewer_client)) == "1 / 1"
    ingest("bravo", 2)
    assert _online(_summary(viewer_client)) == "2 / 2"


@pytest.fixture
def kept_then(viewer_client, django_capture_on_commit_callbacks):
    """kept_then(change): the summary fragment after `change` (committed), with the
    summary kept just before it."""
    def then(change) -> str:
        _summary(viewer_client)
        with django_capture_on_commit_callbacks(execute=True):
            change()
        return _summary(viewer_client)

    return then


def test_a_maintenance_window_set_or_ended_shows_at_once(operator_client, operator, kept_then):
    ingest("alpha", 2)
    ingest("bravo", 2)
    until = timezone.localtime(timezone.now() + timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M")
    html = kept_then(lambda: operator_client.post(reverse("fleet:set_maintenance", args=["alpha"]),
                                                  {"until": until, "reason": "swap PSU"}))
    assert "1 in maintenance" in html
    assert "in maintenance" not in kept_then(lambda: maintenance.end(Node.objects.get(name="alpha"), operator))


def test_an_xid_acknowledged_shows_at_once(viewer_client, admin_user, kept_then):
    snap = snapshot("alpha", 2)
    snap["devices"][1]["xid_errors"] = [{"xid": 119, "count": 2, "last_seen": "2026-12-03T16:05:10+00:00",
                                        "description": "GSP RPC timeout"}]
    snap["findings"].append({"code": "gpu1.xid", "name": "GPU 1", "status": "fail",
                             "message": "Kernel log: Xid 119 ×2", "fix": "Reset the GPU"})
    ingest_snapshot(snap)
    assert "1 node failing" in _summary(viewer_client)
    assert "1 node failing" not in kept_then(lambda: acknowledge_xids(Node.objects.get(name="alpha"), 1, admin_user))


def test_a_claim_made_shows_at_once(viewer_client, operator, kept_then):
    node = ingest("alpha", 8)
    assert "0 <small>/ 8 free</small>" in _summary(viewer_client)
    html = kept_then(lambda: claims.save_claim(node, gpu.Claim(name="train", count=3), operator))
    assert "3 <small>/ 5 free</small>" in html
