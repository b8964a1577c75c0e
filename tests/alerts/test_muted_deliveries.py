"""A delivery held back because its node was muted still reads as what it would have
said, names its node, and says what muted it: a silence (which one) or maintenance, on
the Deliveries page and in the API."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Silence
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Maintenance, Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def _rows(html: str) -> list[str]:
    return [" ".join(re.sub(r"<[^>]+>", " ", row).split()) for row in re.findall(r"<tr>(.*?)</tr>", html, re.S)[1:]]


def test_muted_deliveries_show_what_they_would_have_said_and_what_muted_them(alert_settings, rule, viewer_client,
                                                                             inbox, webhook):
    rule.channels.set(rule.channels.filter(name="hook"))
    silenced, maintained = Node.objects.bulk_create([Node(name="gpu-a01"), Node(name="gpu-b01")])
    silence = Silence.objects.create(nodes="gpu-a*", starts_at=T0 - timedelta(hours=1),
                                     ends_at=T0 + timedelta(hours=2), reason="PDU swap")
    Maintenance.objects.create(node=maintained, until=T0 + timedelta(hours=2), reason="new PSU",
                               started_at=T0 - timedelta(hours=1))
    events.observe([Kind.FINDING], [silenced.pk, maintained.pk], [
        events.Condition(n.pk, Kind.FINDING, "gpu3.xid", Severity.FAIL, "GPU 3 Xid 79", "fell off the bus", 3)
        for n in (silenced, maintained)], T0)
    with time_machine.travel(T0 + timedelta(minutes=10), tick=False):
        services.run_once()
    assert webhook.posts == []

    rows = _rows(viewer_client.get("/alerts/deliveries/").content.decode())
    assert len(rows) == 2 and all("—" not in row for row in rows)
    by_node = {("gpu-a01" if "gpu-a01" in row else "gpu-b01"): row for row in rows}
    assert "GPU failing: gpu-a01 GPU 3 (Xid 79)" in by_node["gpu-a01"]
    assert "silenced by gpu-a* until" in by_node["gpu-a01"] and "PDU swap" in by_node["gpu-a01"]
    assert "GPU failing: gpu-b01 GPU 3 (Xid 79)" in by_node["gpu-b01"]
    assert "in maintenance" in by_node["gpu-b01"] and "silenced" not in by_node["gpu-b01"]

    api = {row["title"]: row for row in viewer_client.get("/api/deliveries/").json()["results"]}
    assert {title: (row["status"], row["muted"], row["silence"]) for title, row in api.items()} == {
        "gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)": ("silenced", "silenced", silence.pk),
        "gpufleet: GPU failing: gpu-b01 GPU 3 (Xid 79)": ("silenced", "maintenance", None),
    }


def test_a_delivery_whose_node_went_into_maintenance_before_it_was_sent_says_so(alert_settings, rule,
                                                                                viewer_client, inbox, webhook):
    alert_settings.GPUFLEET_ALERT_GROUP_S = 30
    node = Node.objects.create(name="gpu-a01")
    events.observe([Kind.FINDING], [node.pk], [
        events.Condition(node.pk, Kind.FINDING, "gpu3.xid", Severity.FAIL, "GPU 3 Xid 79", "", 3)], T0)
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        services.run_once()  # planned, waiting out the grouping window
    Maintenance.objects.create(node=node, until=T0 + timedelta(hours=2), reason="new PSU",
                               started_at=T0 + timedelta(minutes=5))
    with time_machine.travel(T0 + timedelta(minutes=6), tick=False):
        services.run_once()
    assert webhook.posts == [] and inbox.messages == []
    api = viewer_client.get("/api/deliveries/").json()["results"]
    assert [(d["status"], d["muted"], d["title"]) for d in api] == [
        ("silenced", "maintenance", "gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)")] * 2
