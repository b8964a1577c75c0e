"""What the node page shows, read with a fixed number of queries whatever the
node's GPU count and however much history it has: its devices (current first,
then vanished) with their charts (one or two history queries for all GPUs, from
the series that fits the range: gpufleet/fleet/history.py), and its findings
worst first."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import prefetch_related_objects

from gpufleet import gpu
from gpufleet.fleet import charts, history
from gpufleet.fleet.models import Device, Finding, FindingStatus, Node

HISTORY_HOURS = charts.RANGES[charts.DEFAULT_RANGE]


def history_range(params) -> str:
    """The node page's history range from its query string; anything else is the default."""
    wanted = params.get("range", "")
    return wanted if wanted in charts.RANGES else charts.DEFAULT_RANGE


@dataclass(frozen=True)
class DeviceRow:
    device: Device
    holder: str | None
    chart: charts.Chart
    stale: bool  # vanished, or its node stopped reporting: last known values, not live
    # This GPU's findings by aspect ("ecc", "thermal", "power", "xid"): the doctor's
    # verdict colours the cells, so the page and the findings never disagree.
    health: dict[str, Finding] = field(default_factory=dict)


def load_for_page(node: Node) -> None:
    """Read the node's devices (all, vanished too) and claims once for the whole page:
    the device table, the ledger and the claims panel (which names each claim's team) all use these."""
    prefetch_related_objects([node], "devices", "claims", "claims__team")
    node.current_devices_cache = sorted((d for d in node.devices.all() if not d.vanished), key=lambda d: d.index)


@dataclass(frozen=True)
class LostCapacity:
    """GPUs the node had and no longer reports, and when the last of them was seen."""

    count: int
    last_seen: datetime


def lost_capacity(node: Node) -> LostCapacity | None:
    """From the devices load_for_page read: no query of its own."""
    vanished = [d for d in node.devices.all() if d.vanished]
    if not vanished:
        return None
    return LostCapacity(len(vanished), max(d.last_seen for d in vanished))


# "gpu3.ecc": the finding about one aspect of GPU 3 (plain "gpu3" is its memory).
_GPU_ASPECT = re.compile(r"gpu([0-9]+)\.([a-z]+)")


def device_rows(node: Node, ledger: gpu.Ledger, now: datetime, hours: float = HISTORY_HOURS) -> list[DeviceRow]:
    devices = sorted(node.devices.all(), key=lambda d: (d.vanished, d.index, d.uuid))
    samples = history.chart_samples(devices, now - timedelta(hours=hours), now)
    by_gpu: dict[int, dict[str, Finding]] = defaultdict(dict)
    # The page has read the findings already (findings_worst_first); reuse them.
    findings = getattr(node, "findings_cache", None)
    for finding in findings if findings is not None else node.findings.all():
        if match := _GPU_ASPECT.fullmatch(finding.code):
            by_gpu[int(match.group(1))][match.group(2)] = finding
    return [
        DeviceRow(
            device=d,
            # A vanished GPU holds nothing, even if a new GPU now has its index.
            holder=None if d.vanished else ledger.holder_of(d.index),
            chart=charts.gpu_chart(samples.get(d.pk, ()), d.vram_total_mib, now, hours, d.power_limit_w),
            stale=d.vanished or node.offline,
            health={} if d.vanished else by_gpu.get(d.index, {}),
        )
        for d in devices
    ]


def findings_worst_first(node: Node) -> list[Finding]:
    """fail → warn → ok, the doctor's own order within each. `remote_fix` says whether
    the node's agent would fix it when asked (whether the user may is access's call)."""
    findings = sorted(node.findings.all(), key=lambda f: (-f.health.rank, f.position))
    for finding in findings:
        finding.remote_fix = finding.code in node.fixes_allowed and (bool(finding.fix) or finding.health != FindingStatus.OK)
    node.findings_cache = findings
    return findings
