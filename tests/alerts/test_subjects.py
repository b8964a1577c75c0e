"""A notification's subject says what happened, how bad and where, as the SMTP receiver
gets it: the whole fleet offline is "Not reporting: 7 nodes", one GPU's Xid its GPU and
Xid, a recovery "Resolved: ..."."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Rule
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def tick(at):
    with time_machine.travel(at, tick=False):
        return services.run_once()


def finding(nodes, code, name, message, at, severity=Severity.FAIL, gpu_index=None):
    events.observe([Kind.FINDING], [n.pk for n in nodes], [
        events.Condition(n.pk, Kind.FINDING, code, severity, name, message, gpu_index) for n in nodes], at)


def test_the_whole_fleet_offline_is_not_reporting_and_its_recovery_resolved(alert_settings, rule, inbox):
    alert_settings.GPUFLEET_ALERT_GROUP_S = 30
    Node.objects.bulk_create([Node(name=f"gpu-a0{i}", offline=True, last_seen=T0) for i in range(1, 8)])
    with time_machine.travel(T0, tick=False):
        events.record_offline(Node.objects.values_list("pk", "last_seen"), T0)
    tick(T0 + timedelta(minutes=5))
    tick(T0 + timedelta(minutes=5, seconds=30))
    assert inbox.subjects() == ["gpufleet: Not reporting: 7 nodes (gpu-a01, gpu-a02, gpu-a03 and 4 more)"]
    assert "Failing or offline: opened: 7 failing, on 7 nodes." in inbox.text(0)
    events.record_offline([], T0 + timedelta(hours=1))
    tick(T0 + timedelta(hours=1))
    tick(T0 + timedelta(hours=1, seconds=30))
    assert inbox.subjects()[1:] == ["gpufleet: Resolved: Not reporting: 7 nodes (gpu-a01, gpu-a02, gpu-a03 and 4 more)"]


def test_a_failing_gpu_names_its_node_gpu_and_xid(alert_settings, rule, inbox):
    node = Node.objects.create(name="gpu-a01")
    finding([node], "gpu3.xid", "GPU 3 (NVIDIA H100 80GB HBM3, PCI 00000000:9B:00.0)",
            "Kernel log: Xid 79 ×1 (GPU has fallen off the bus)", T0, gpu_index=3)
    tick(T0 + timedelta(minutes=5))
    events.observe([Kind.FINDING], [node.pk], [], T0 + timedelta(minutes=6))  # cleared
    tick(T0 + timedelta(minutes=6))
    assert inbox.subjects() == ["gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)",
                                "gpufleet: Resolved: GPU failing: gpu-a01 GPU 3 (Xid 79)"]
    assert "gpu-a01: GPU 3 (NVIDIA H100 80GB HBM3, PCI 00000000:9B:00.0) (failing, since 2026-03-02 03:00 UTC): " \
           "Kernel log: Xid 79" in inbox.text(0)


def test_warnings_of_other_kinds_and_of_the_site_say_their_kind_and_severity(alert_settings, channels, inbox):
    everything = Rule.objects.create(name="everything", min_severity=Severity.WARN, wait_minutes=0, created_at=T0)
    everything.channels.set(channels[:1])
    hot, toolkit = Node.objects.bulk_create([Node(name="gpu-a01"), Node(name="gpu-b01")])
    finding([hot], "gpu2.thermal", "GPU 2 (NVIDIA H100 80GB HBM3)", "Running hot at 91 °C", T0, Severity.WARN, 2)
    tick(T0)
    finding([toolkit], "toolkit", "NVIDIA Container Toolkit", "nvidia-ctk not found", T0 + timedelta(minutes=1),
            Severity.WARN)
    tick(T0 + timedelta(minutes=1))
    with time_machine.travel(T0 + timedelta(minutes=2), tick=False):
        events.record_ingest_silent("no snapshot stored for 10 minutes", T0 + timedelta(minutes=2))
    tick(T0 + timedelta(minutes=2))
    assert inbox.subjects() == ["gpufleet: GPU warning: gpu-a01 GPU 2 (temperature)",
                                "gpufleet: Warning: gpu-b01 NVIDIA Container Toolkit",
                                "gpufleet: No snapshots arriving (failing): the site"]
