"""Events are still recorded while muted, and say so: every alert tick marks the open
events of a node under an active silence "silenced" and of a node in maintenance
"maintenance" (maintenance wins), with or without rules, in a fixed number of
statements; the marks show on the Events page, the node's timeline, the filter, the
export and the API."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.alerts import services
from gpufleet.alerts.models import Rule, Silence
from gpufleet.events import services as events
from gpufleet.events.models import Event, Kind, Muted, Severity
from gpufleet.fleet.models import Maintenance, Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def failing(nodes, at):
    events.observe([Kind.FINDING], [n.pk for n in nodes], [
        events.Condition(n.pk, Kind.FINDING, "gpu3.xid", Severity.FAIL, "GPU 3 Xid 79", "GPU 3 fell off the bus", 3)
        for n in nodes
    ], at)


def tick(at):
    with time_machine.travel(at, tick=False):
        return services.run_once()


def silence(nodes: str) -> Silence:
    return Silence.objects.create(nodes=nodes, starts_at=T0 - timedelta(hours=1), ends_at=T0 + timedelta(hours=2),
                                  reason="reboots")


def maintain(node: Node) -> Maintenance:
    return Maintenance.objects.create(node=node, until=T0 + timedelta(hours=2), reason="new PSU",
                                      started_at=T0 - timedelta(hours=1))


def muted_by_node() -> dict[str, str]:
    return dict(Event.objects.values_list("node__name", "muted"))


@pytest.fixture
def nodes(db):
    return [Node.objects.create(name=name) for name in ("gpu-a01", "gpu-a02", "gpu-b01")]


def test_a_silenced_node_gets_its_events_marked_and_nothing_delivered(alert_settings, rule, nodes, inbox, webhook):
    silence("gpu-a*")
    maintain(nodes[1])
    failing(nodes, T0)
    tick(T0 + timedelta(minutes=10))
    assert muted_by_node() == {"gpu-a01": Muted.SILENCED, "gpu-a02": Muted.MAINTENANCE, "gpu-b01": ""}
    # Only the unmuted node is announced.
    assert webhook.titles() == ["gpufleet: GPU failing: gpu-b01 GPU 3 (Xid 79)"] and inbox.subjects() == webhook.titles()


def test_events_are_marked_without_any_rule_and_keep_their_mark(alert_settings, nodes):
    Rule.objects.all().delete()
    window = silence("gpu-b01")
    failing(nodes, T0)
    tick(T0)
    assert muted_by_node() == {"gpu-a01": "", "gpu-a02": "", "gpu-b01": Muted.SILENCED}
    window.delete()
    maintain(nodes[0])
    tick(T0 + timedelta(minutes=1))
    # The silenced one stays silenced (it was, when seen); the other is marked anew.
    assert muted_by_node() == {"gpu-a01": Muted.MAINTENANCE, "gpu-a02": "", "gpu-b01": Muted.SILENCED}


def test_a_closed_event_is_left_as_it_was(alert_settings, nodes):
    failing(nodes[:1], T0)
    events.observe([Kind.FINDING], [nodes[0].pk], [], T0 + timedelta(minutes=1))  # cleared, and closed at once
    silence("*")
    tick(T0 + timedelta(minutes=2))
    assert muted_by_node() == {"gpu-a01": ""}


@pytest.mark.parametrize("muted_nodes", ["silence", "maintenance"])
def test_marking_reads_a_fixed_number_of_statements_whatever_the_events(alert_settings, muted_nodes):
    counts = []
    for size in (1, 30):
        Event.objects.all().delete()
        Node.objects.all().delete()
        fleet = Node.objects.bulk_create([Node(name=f"gpu-{size}-{i}") for i in range(size)])
        Node.objects.bulk_create([Node(name=f"ok-{size}-{i}") for i in range(size)])
        if muted_nodes == "silence":
            silence(f"gpu-{size}-*")
        else:
            Maintenance.objects.bulk_create([Maintenance(node=n, until=T0 + timedelta(hours=1), reason="r")
                                             for n in fleet])
        failing(list(Node.objects.all()), T0)
        with CaptureQueriesContext(connection) as ctx:
            services.mark_muted(T0)
        counts.append(len(ctx.captured_queries))
        assert Event.objects.exclude(muted="").count() == size
    assert counts[0] == counts[1] <= 4  # open events, silences, maintenance, one update


def test_the_events_page_timeline_filter_export_and_api_show_the_mark(alert_settings, nodes, viewer_client):
    silence("gpu-a01")
    maintain(nodes[1])
    failing(nodes, T0)
    services.mark_muted(T0)
    page = viewer_client.get("/events/").content.decode()
    assert page.count('<span class="badge badge-grey">silenced</span>') == 1
    assert page.count('<span class="badge badge-blue">in maintenance</span>') == 1
    timeline = viewer_client.get("/nodes/gpu-a02/").content.decode()
    assert '<span class="badge badge-blue">in maintenance</span>' in timeline

    listed = viewer_client.get("/events/?muted=maintenance").content.decode()
    assert "gpu-a02" in listed and "gpu-a01" not in listed and "gpu-b01" not in listed
    api = viewer_client.get("/api/events/?muted=silenced").json()
    assert [(e["node"], e["muted"]) for e in api["results"]] == [("gpu-a01", "silenced")]
    heard = viewer_client.get("/api/events/?muted=no").json()
    assert [(e["node"], e["muted"]) for e in heard["results"]] == [("gpu-b01", "")]
    assert viewer_client.get("/api/events/?muted=loud").status_code == 400

    exported = json.loads(b"".join(viewer_client.get("/events/export.json?muted=maintenance").streaming_content))
    assert "muted" in exported["columns"] and [r["muted"] for r in exported["rows"]] == ["maintenance"]
    csv = b"".join(viewer_client.get("/events/export.csv").streaming_content).decode()
    assert csv.splitlines()[0].split(",")[-1] == "muted" and csv.count(",silenced") == 1
