"""Usage accounting at a collect interval like production's: many snapshots add into
each five-minute row, an agent's snapshots come at their own pace and off any grid
(here every 45 s with jitter, the centre's interval being 60 s), and a node first
seen in the middle of an hour, silent for a quarter of an hour, then deleted. The
figures are worked out from the script's times; each may be off by one collect
interval (60 s) for every change on the GPUs it counts: the node's first snapshot,
the period's end, the outage's start and end, the claim, the image switch."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model

from gpufleet import gpu
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import record, report, tasks
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.claims.helpers import save_owned
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

SETTING = 60  # the centre's GPUFLEET_COLLECT_INTERVAL
PERIOD = 45  # how often this agent collects, give or take JITTER
JITTER = 10
HOUR = datetime(2026, 3, 2, 9, tzinfo=UTC)
FIRST = HOUR + timedelta(minutes=47, seconds=13)  # the node's first snapshot
CLAIMED = HOUR + timedelta(hours=1, minutes=5, seconds=20)
OFFLINE = (HOUR + timedelta(hours=1, minutes=21, seconds=30), HOUR + timedelta(hours=1, minutes=38, seconds=10))
SWITCH = HOUR + timedelta(hours=1, minutes=47, seconds=40)  # GPU 0's container is replaced
END = HOUR + timedelta(hours=2)  # the report's end
LAST = END + timedelta(minutes=8)  # the node's last snapshot
BUSY_W, IDLE_W = 250.0, 40.0
OLD = {"id": "0a1b2c3d4e5f", "name": "train-1", "image": "train:1", "claim": None}
NEW = {"id": "5f4e3d2c1b0a", "name": "train-2", "image": "train:2", "claim": None}


def moments():
    """The agent's collection times: every PERIOD seconds, each off by up to JITTER."""
    k = 0
    while (moment := FIRST + timedelta(seconds=k * PERIOD)) <= LAST:
        jitter = 0 if k == 0 else (k * 7919) % (2 * JITTER + 1) - JITTER
        yield moment + timedelta(seconds=jitter)
        k += 1


def _snapshot(template: dict, moment: datetime) -> dict:
    snap = copy.deepcopy(template)
    snap["collected_at"] = moment.isoformat()
    box = OLD if moment < SWITCH else NEW
    busy, idle = snap["devices"]
    busy.update(utilization_percent=97, power_draw_w=BUSY_W,
                processes=[{"pid": 4242, "name": "python3", "used_mib": 60000, "container": box}])
    idle.update(utilization_percent=0, power_draw_w=IDLE_W)
    return snap


def hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600


ONE = SETTING / 3600  # one change's worth, in GPU-hours


def test_many_jittered_snapshots_a_bucket_add_up_to_the_hours_held_used_and_unknown(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = SETTING
    settings.GPUFLEET_PRICE_GPU_HOUR, settings.GPUFLEET_PRICE_KWH = {}, None
    alice = get_user_model().objects.create_user("alice")
    template = snapshot("solo", 2, at=FIRST, name="NVIDIA L40S")
    with time_machine.travel(FIRST, tick=False) as clock:
        claimed, unrolled = False, None
        for moment in moments():
            if OFFLINE[0] <= moment < OFFLINE[1]:
                continue
            if not claimed and moment > CLAIMED:
                clock.move_to(CLAIMED)
                save_owned(Node.objects.get(name="solo"), gpu.Claim("night", device_ids=("0",)), alice)
                claimed = True
            clock.move_to(moment)
            assert [r.outcome for r in ingest_snapshots([_snapshot(template, moment)])] == ["accepted"]
            tasks.roll_usage()
            if moment >= END and unrolled is None:  # its last hour is not rolled yet
                assert record.rolled_until() == END - timedelta(hours=1)
                unrolled = report.report(HOUR, END, "image")
        # Several snapshots went into each five-minute row.
        assert UsageFiveMinutes.objects.filter(claim="night").count() < 30
        clock.move_to(LAST + timedelta(minutes=1))
        tasks.roll_usage()
    assert record.rolled_until() == END

    whole = hours(END - FIRST)
    outage = hours(OFFLINE[1] - OFFLINE[0])
    held = hours(END - CLAIMED) - outage
    found = report.report(HOUR, END, "image")
    for rows in (unrolled.rows, found.rows):  # the last hour from five-minute rows, or rolled: the same
        by_image = {row.key["image"]: row for row in rows}
        assert set(by_image) == {"", "train:1", "train:2"}
        old, new, idle = by_image["train:1"], by_image["train:2"], by_image[""]
        assert new.reserved == new.used == pytest.approx(hours(END - SWITCH), abs=2 * ONE)
        assert old.used == pytest.approx(whole - outage - hours(END - SWITCH), abs=5 * ONE)
        assert old.used_unreserved == pytest.approx(hours(CLAIMED - FIRST), abs=2 * ONE)
        assert old.reserved == pytest.approx(held - hours(END - SWITCH), abs=4 * ONE)
        assert idle.used == idle.reserved == 0
        assert idle.energy_kwh == pytest.approx((whole - outage) * IDLE_W / 1000, abs=4 * ONE * IDLE_W / 1000)
    total = found.total
    assert total.reserved == pytest.approx(held, abs=4 * ONE)
    assert total.idle_reserved == pytest.approx(0, abs=1e-9)
    assert total.used == pytest.approx(whole - outage, abs=4 * ONE)
    assert total.unknown == pytest.approx(2 * outage, abs=4 * ONE)  # both GPUs, offline
    assert unrolled.total.unknown == 0  # the beat counts an hour's unknown time as it rolls it
    assert total.energy_kwh == pytest.approx((whole - outage) * (BUSY_W + IDLE_W) / 1000,
                                             abs=8 * ONE * BUSY_W / 1000)
    assert total.power_unknown == 0 and total.cost is None

    # A deleted node keeps its past hours under its name.
    Node.objects.get(name="solo").delete()
    by_node = report.report(HOUR, END, "node").rows
    assert [(row.key["node"], row.reserved) for row in by_node] == [("solo", total.reserved)]
    assert UsageHour.objects.filter(node="solo").exists()
