"""The overview says what is wrong, loudly: nodes that stopped reporting count as a
problem (an alarm above GPUFLEET_OFFLINE_ALARM_PERCENT of the fleet), "and N more"
links to the filtered list, and the fleet's findings are grouped by cause with the
fix once per cause."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.html import escape

from gpufleet import gpu
from gpufleet.fleet.models import Finding, Maintenance, Node
from gpufleet.fleet.summary import FleetSummary

pytestmark = pytest.mark.django_db

RUNTIME_FIX = "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"


def _nodes(count: int, prefix: str = "n", **fields) -> list[Node]:
    return [Node.objects.create(name=f"{prefix}{i:03d}", present=True, **fields) for i in range(count)]


def test_many_nodes_not_reporting_sound_the_alarm(viewer_client, settings):
    settings.GPUFLEET_OFFLINE_ALARM_PERCENT = 10
    _nodes(8)
    _nodes(2, "gone", offline=True)
    _nodes(1, "sick", health="fail")
    page = viewer_client.get("/").content.decode()
    assert "tile tile-alarm" in page and "Nodes not reporting" in page
    assert "18% of the fleet" in page
    findings = [f.code for f in FleetSummary().findings]
    assert findings[0] == "offline"  # louder than the failing node
    assert "2 nodes stopped reporting: 18% of the fleet" in page


def test_a_few_nodes_not_reporting_are_a_problem_but_no_alarm(viewer_client, settings):
    settings.GPUFLEET_OFFLINE_ALARM_PERCENT = 10
    _nodes(19)
    _nodes(1, "gone", offline=True)
    tiles = FleetSummary().tiles
    assert tiles["not_reporting"] == 1 and tiles["offline_percent"] == 5 and not tiles["offline_alarm"]
    page = viewer_client.get("/").content.decode()
    assert "tile-alarm" not in page
    assert 'class="tile tile-red" href="/?offline=yes"' in page


def test_and_n_more_links_to_the_filtered_list(viewer_client):
    _nodes(12, "sick", health="fail")
    _nodes(13, "gone", offline=True)
    page = viewer_client.get("/").content.decode()
    assert '<a href="/?health=fail">and 2 more</a>' in page
    assert '<a href="/?offline=yes">and 3 more</a>' in page


def test_findings_are_grouped_by_cause_with_the_fix_once(viewer_client):
    xid79 = gpu.xid_code(79)
    a, b = _nodes(2, "xid", health="fail")
    for node, index in ((a, 0), (a, 3), (b, 1)):
        Finding.objects.create(node=node, code=f"gpu{index}.xid", name=f"GPU {index}", status="fail",
                               message=f"Kernel log: Xid 79 ×{index + 1} ({xid79.description})", fix=xid79.action)
    for node in _nodes(12, "rt", health="warn"):
        Finding.objects.create(node=node, code="runtime", name="nvidia runtime", status="warn",
                               message="No nvidia runtime in Docker", fix=RUNTIME_FIX)
    page = viewer_client.get("/").content.decode()
    assert "Problems by cause" in page
    assert "Xid 79 on 3 GPUs of 2 nodes" in page
    assert "12 nodes: No nvidia runtime in Docker" in page
    assert page.count(escape(RUNTIME_FIX)) == 1 and page.count(escape(xid79.action)) == 1
    causes = next(f for f in FleetSummary().findings if f.code == "causes")
    assert [i.text for i in causes.items] == ["Xid 79 on 3 GPUs of 2 nodes", "12 nodes: No nvidia runtime in Docker"]


def test_nodes_in_maintenance_are_counted_apart(viewer_client):
    sick = _nodes(3, "sick", health="fail")
    gone = _nodes(1, "gone", offline=True)
    until = timezone.now() + timedelta(hours=1)
    for node in (sick[0], gone[0]):
        Maintenance.objects.create(node=node, until=until, reason="swap PSU")
        Finding.objects.create(node=node, code="driver", name="NVIDIA driver", status="fail", message="gone")
    tiles = FleetSummary().tiles
    assert (tiles["failing"], tiles["not_reporting"], tiles["maintenance"]) == (2, 0, 2)
    assert all(f.code != "causes" for f in FleetSummary().findings)
    # Its time passed: it counts again.
    Maintenance.objects.update(until=timezone.now() - timedelta(seconds=1))
    assert FleetSummary().tiles["failing"] == 3
