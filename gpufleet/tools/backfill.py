"""History for benchmarks and demos, made the way the site makes it: raw samples
as ingest writes them, then the housekeeping replayed over their time (roll-ups
every half hour of it, retention at the end), so the rollups are the real ones. And the
timing of the node page against Django's admin changelist of the same nodes."""

from __future__ import annotations

import math
import statistics
import time
from datetime import datetime, timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gpufleet.fleet import history
from gpufleet.fleet.models import Device, DeviceSample

_BATCH = 5000


def add_history(devices: list[Device], end: datetime, hours: float = 24, every: timedelta = timedelta(seconds=30)) -> int:
    """`hours` of history before `end` for `devices`, one sample per GPU every `every`
    (smooth, different per GPU), rolled up and pruned as the beat would have done.
    Returns the raw samples written (fewer are kept: raw retention applies)."""
    start = end - timedelta(hours=hours)
    history.prepare_partitions(now=end, since=start)
    steps = int(hours * 3600 // every.total_seconds())
    written = 0
    batch: list[DeviceSample] = []
    for device in devices:
        total = device.vram_total_mib or 80_000
        for step in range(steps):
            phase = step / 40 + device.index
            batch.append(DeviceSample(
                device_id=device.pk,
                collected_at=start + step * every,
                vram_used_mib=int(total * (0.45 + 0.3 * math.sin(phase))),
                utilization_percent=int(50 + 45 * math.sin(phase * 1.7)),
                temperature_c=int(55 + 20 * math.sin(phase)),
                power_draw_w=round(350 + 250 * math.sin(phase * 1.3), 1),
            ))
            if len(batch) >= _BATCH:
                DeviceSample.objects.bulk_create(batch)
                written, batch = written + len(batch), []
    DeviceSample.objects.bulk_create(batch)
    written += len(batch)
    # The beat's runs, one every half hour of the history (each may catch up an hour).
    at = start
    while at < end:
        at = min(end, at + timedelta(minutes=30))
        history.roll(now=at)
    history.roll(now=end)
    history.prune(now=end)
    return written


def _timed_get(client, url: str) -> tuple[float, int]:
    with CaptureQueriesContext(connection) as ctx:
        began = time.perf_counter()
        response = client.get(url)
        elapsed = time.perf_counter() - began
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}")
    return 1000 * elapsed, len(ctx)


def median_ms(client, url: str, repeat: int = 5) -> tuple[float, int]:
    """The median time of `repeat` GETs of `url` in ms, and the queries of the last one."""
    timed = [_timed_get(client, url) for _ in range(repeat)]
    return statistics.median(ms for ms, _ in timed), timed[-1][1]


def node_page_vs_admin(client, node_name: str, repeat: int = 9) -> dict[str, tuple[float, int]]:
    """The node page with its 24 h charts against Django's admin changelist of the
    nodes (`client` logged in as a superuser): median ms and queries of each, the two
    requests taking turns so a busy machine slows both alike."""
    pages = {
        "node page 24h": reverse("fleet:node_detail", args=[node_name]) + "?range=24h",
        "admin node changelist": reverse("admin:fleet_node_changelist"),
    }
    timed: dict[str, list[tuple[float, int]]] = {label: [] for label in pages}
    for _ in range(repeat):
        for label, url in pages.items():
            timed[label].append(_timed_get(client, url))
    return {label: (statistics.median(ms for ms, _ in runs), runs[-1][1]) for label, runs in timed.items()}
