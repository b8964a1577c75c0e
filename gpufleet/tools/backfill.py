"""History for benchmarks and demos, made the way the site makes it: raw samples
as ingest writes them, then rolled up by the housekeeping's own code over their time
and pruned at the end, so the rollups are the real ones."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

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
    # The beat rolls each bucket once, after its grace: these are in the past, and may be
    # older than what it rolled already.
    history.roll_between(start, end)
    history.prune(now=end)
    return written

