"""Usage data for the API's and the command's tests: hourly rows written by hand, whose
figures are known to the second, and a day of two nodes stored through the real ingest
and rolled by the beat's own code."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.teams.models import Team
from gpufleet.usage import record, rollup
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.claims.helpers import claim, save_owned
from tests.factories import snapshot

DAY = "2025-03-04"
TEN = datetime(2025, 3, 4, 10, tzinfo=UTC)


def hour(**values) -> UsageHour:
    """One hourly row at 10:00 on DAY; a key of its own unless given."""
    values.setdefault("bucket", TEN)
    values.setdefault("node_id", 1)
    values.setdefault("node", "alpha")
    values.setdefault("key", f"k{UsageHour.objects.count()}")
    return UsageHour.objects.create(**values)


def known_hours() -> None:
    """alpha, 10:00 to 11:00 on DAY: otto's claim 'train' (id 7, of team vision) held 2 GPUs, busy half
    the time, drawing 1.4 kWh; one unreserved H200 was busy half an hour without a power
    reading; beta's 2 A100s were never heard from (an unknown hour each), and vera's
    'notebooks' (id 8) held one of them idle in the five-minute rows of 11:00."""
    hour(claim_id=7, claim="train", owner="otto", team="vision", model="NVIDIA H200", image="pytorch/pytorch:2.5.1", label="train",
         seen_s=7200, used_s=3600, power_s=7200, energy_wh=1400)
    hour(model="NVIDIA H200", seen_s=3600, used_s=1800)
    hour(node_id=2, node="beta", model="NVIDIA A100", key=record.UNKNOWN_KEY, unknown_s=7200)
    UsageFiveMinutes.objects.create(bucket=TEN + timedelta(hours=1), node_id=2, node="beta", claim_id=8,
                                    claim="notebooks", owner="vera", model="NVIDIA A100", key="n",
                                    seen_s=300, power_s=300, energy_wh=10)


def _busy(name: str, gpus: int, at: datetime, **kwargs) -> dict:
    snap = snapshot(name, gpus, at=at, **kwargs)
    for device in snap["devices"]:
        device["power_draw_w"] = 300.0
    return snap


def ingested_day(otto, vera) -> None:
    """DAY from 10:00 to 12:30, a snapshot of each node every ten minutes (the collect
    interval is 600 s here): alpha's 4 H200s busy, 'train' (otto's) holding 2 of them,
    a container labelled for it on GPU 0, for team vision; beta's 2 A100s idle, all held
    by 'notebooks' (vera's, in no team). Both claims are made after the first snapshot, so they count from the
    snapshot of 10:10 on (each covers the ten minutes before it). The beat rolls at
    12:05, so 12:00 to 12:30 is read from the five-minute rows."""
    box = {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": "train"}
    for step in range(16):
        at = TEN + step * timedelta(minutes=10)
        alpha = _busy("alpha", 4, at)
        alpha["devices"][0]["processes"] = [{"pid": 4412, "name": "python3", "used_mib": 30720, "container": box}]
        beta = snapshot("beta", 2, at=at, util="0", name="NVIDIA A100-SXM4-80GB")
        assert {r.outcome for r in ingest_snapshots([alpha, beta])} == {"accepted"}
        if step == 0:
            train = claim(Node.objects.get(name="alpha"), "train", otto, count=2)
            Claim.objects.filter(pk=train.pk).update(team=Team.objects.create(name="vision"))
            save_owned(Node.objects.get(name="beta"), gpu.Claim("notebooks"), vera)  # vera is in no team
    rollup.roll(TEN + timedelta(hours=2, minutes=5))
