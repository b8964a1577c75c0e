"""Snapshots stored late (the ingest stream's backlog after the consumers were down)
still count: where the beat rolled their hour already, they are added to its hourly
rows and the time they cover is no longer unknown."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import report, rollup, tasks
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

INTERVAL = 300
DAY = datetime(2026, 3, 2, tzinfo=UTC)
DOWN = (DAY + timedelta(hours=10, minutes=40), DAY + timedelta(hours=11, minutes=25))  # no consumer stores


def at(hour: int, minute: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute)


def test_a_backlog_stored_after_its_hour_was_rolled_is_counted_and_not_unknown(settings, operator):
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL
    template = snapshot("late", 2, at=at(9))
    backlog = []
    with time_machine.travel(at(9), tick=False) as clock:
        moment = at(9)
        while moment < at(12, 10):
            clock.move_to(moment)
            if moment == at(9, 30):
                claims.save_claim(Node.objects.get(name="late"), gpu.Claim("c", device_ids=("0",)), operator)
            snap = copy.deepcopy(template)
            snap["collected_at"] = moment.isoformat()
            backlog.append(snap)
            if not DOWN[0] <= moment < DOWN[1]:
                for each in backlog:  # the consumers are back: the backlog in order, then this one
                    assert ingest_snapshots([each])[0].outcome == "accepted"
                backlog = []
            tasks.roll_usage()  # the beat went on: hour 10 was rolled at 11:05, its last 20 minutes missing
            moment += timedelta(seconds=INTERVAL)
        assert rollup.rolled_until() == at(12)

    total = report.report(at(9), at(12), "node").total
    assert total.unknown == 0
    assert total.power_unknown == pytest.approx(2 * 3.0)  # every GPU-hour seen (the fake node has no power reading)
    assert total.reserved == pytest.approx(2.5)  # GPU 0 from the snapshot at 09:30 on
    # The same from the five-minute rows, for a period starting inside hour 10.
    assert report.report(at(10, 30), at(12), "node").total.power_unknown == pytest.approx(2 * 1.5)
    # A second roll changes nothing.
    with time_machine.travel(at(12, 30), tick=False):
        tasks.roll_usage()
    assert report.report(at(9), at(12), "node").total.power_unknown == pytest.approx(2 * 3.0)
