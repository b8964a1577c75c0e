"""What the node page shows, read with a fixed number of queries whatever the
node's GPU count: its devices (current first, then vanished) with their 24 h
charts from one sample query, its findings worst first, and its recent jobs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.fleet.models import Device, DeviceSample, Finding, Health, Node
from gpufleet.jobs.models import Job
from gpufleet.web import charts

HISTORY_HOURS = 24
RECENT_JOBS = timedelta(minutes=15)


@dataclass(frozen=True)
class DeviceRow:
    device: Device
    holder: str | None
    chart: charts.Chart
    stale: bool  # vanished, or its node stopped reporting: last known values, not live


def device_rows(node: Node, holder_by_index: dict, now: datetime) -> list[DeviceRow]:
    devices = sorted(node.devices.all(), key=lambda d: (d.vanished, d.index, d.uuid))
    samples: dict[int, list[charts.Sample]] = defaultdict(list)
    rows = (
        DeviceSample.objects.filter(device__node=node, collected_at__gte=now - timedelta(hours=HISTORY_HOURS))
        .order_by("device_id", "collected_at")
        .values_list("device_id", "collected_at", "vram_used_mib", "utilization_percent")
    )
    for device_id, at, vram, util in rows:
        samples[device_id].append(charts.Sample(at, vram, util))
    return [
        DeviceRow(
            device=d,
            # A vanished GPU holds nothing, even if a new GPU now has its index.
            holder=None if d.vanished else holder_by_index.get(d.index),
            chart=charts.gpu_chart(samples.get(d.pk, ()), d.vram_total_mib, now, HISTORY_HOURS),
            stale=d.vanished or node.offline,
        )
        for d in devices
    ]


def findings_worst_first(node: Node) -> list[Finding]:
    """fail → warn → ok, the doctor's own order within each. `remote_fix` says whether
    the node's agent would fix it when asked (whether the user may is access's call)."""
    order = {Health.FAIL: 0, Health.WARN: 1, Health.OK: 2}
    findings = sorted(node.findings.all(), key=lambda f: (order.get(f.status, 3), f.position))
    for finding in findings:
        finding.remote_fix = finding.code in node.fixes_allowed and (bool(finding.fix) or finding.status != Health.OK)
    return findings


def recent_jobs(node: Node, now: datetime) -> list[Job]:
    """Jobs still open or asked for in the last minutes: shown (and polled) on the page,
    so a browser without JavaScript sees its request's progress after the redirect."""
    return list(node.jobs.filter(created_at__gte=now - RECENT_JOBS).select_related("node", "requested_by")[:5])
