"""Reading usage back (gpufleet/usage/report.py): a period that starts or ends inside
an hour counts that part of the hour, not the whole hour or none of it; and a report
costs the same few queries whatever the number of rows."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import record, report, rollup, tasks
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

INTERVAL = 300
DAY = datetime(2026, 3, 2, tzinfo=UTC)


def at(hour: int, minute: int = 0) -> datetime:
    return DAY + timedelta(hours=hour, minutes=minute)


@pytest.fixture
def fleet(settings, operator):
    """One node of two GPUs sending every five minutes from 09:00 until 13:55, rolled
    by the beat; a claim on GPU 0 from 10:52 on."""
    settings.GPUFLEET_COLLECT_INTERVAL = INTERVAL
    template = snapshot("one", 2, at=at(9))
    with time_machine.travel(at(9), tick=False) as clock:
        moment = at(9)
        while moment < at(14):
            if moment == at(10, 55):
                clock.move_to(at(10, 52))
                claims.save_claim(Node.objects.get(name="one"), gpu.Claim("c", device_ids=("0",)), operator)
            clock.move_to(moment)
            snap = copy.deepcopy(template)
            snap["collected_at"] = moment.isoformat()
            assert ingest_snapshots([snap])[0].outcome == "accepted"
            tasks.roll_usage()
            moment += timedelta(seconds=INTERVAL)
        assert rollup.rolled_until() == at(13)
        yield clock


def seen(start: datetime, end: datetime) -> float:
    """GPU-hours seen: the power unknown (the fake node reports no power), all of them."""
    return report.report(start, end, "node").total.power_unknown


PERIODS = [
    (at(9), at(13), 4.0),  # whole hours
    (at(10, 30), at(12), 1.5),  # starts inside a rolled hour
    (at(10), at(11, 20), 1 + 20 / 60),  # ends inside a rolled hour
    (at(10, 30), at(10, 45), 0.25),  # inside one rolled hour
    (at(12, 30), at(13, 40), 1 + 10 / 60),  # from a rolled hour into the hour not rolled yet
    (at(13, 10), at(13, 40), 0.5),  # inside the hour not rolled yet
]


def test_a_period_counts_the_part_of_each_hour_inside_it(fleet):
    for start, end, hours in PERIODS:
        assert seen(start, end) == pytest.approx(2 * hours), (start, end)


def test_a_claim_s_hours_since_a_moment_inside_an_hour_are_exact_while_five_minute_rows_are_kept(fleet):
    claim_id = report.report(at(9), at(14), "claim").rows[0].key["claim_id"]
    found = report.report(at(10, 30), at(12), "claim", {"claim_id": claim_id})
    assert found.total.reserved == pytest.approx(1 + 8 / 60, abs=INTERVAL / 3600)  # from 10:52, to one interval


def test_an_hour_whose_five_minute_rows_are_pruned_counts_its_share_of_the_hourly_row(fleet, settings):
    settings.GPUFLEET_USAGE_5M_HOURS = 2.0
    fleet.move_to(at(16))
    rollup.prune()
    assert not UsageFiveMinutes.objects.filter(bucket__lt=at(13)).exists()
    for start, end, hours in PERIODS:
        assert seen(start, end) == pytest.approx(2 * hours), (start, end)


# --- Queries ------------------------------------------------------------------------------


def _rows(nodes: int) -> None:
    """Hourly rows for two rolled hours and five-minute rows after them, for `nodes`
    nodes of several claims, teams and images each."""
    found = []
    for node in range(nodes):
        for n in range(3):
            values = (node * 10 + n, f"claim-{n}", f"user-{n}", "NVIDIA H100", f"image:{n}", "")
            found.append((node, f"node-{node}", values))
    hours = [UsageHour(bucket=at(hour), node_id=node, node=name, claim_id=v[0], claim=v[1], owner=v[2],
                       team=f"team-{node % 4}", model=v[3], image=v[4], label=v[5], key=record.key_digest(v),
                       seen_s=3600, used_s=1800, power_s=3600, energy_wh=300)
             for hour in (9, 10) for node, name, v in found]
    fives = [UsageFiveMinutes(bucket=at(11, minute), node_id=node, node=name, claim_id=v[0], claim=v[1], owner=v[2],
                              team=f"team-{node % 4}", model=v[3], image=v[4], label=v[5], key=record.key_digest(v),
                              seen_s=300, used_s=300)
             for minute in (0, 5, 10) for node, name, v in found]
    UsageHour.objects.bulk_create(hours)
    UsageFiveMinutes.objects.bulk_create(fives)


def _queries(by: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        found = report.report(at(9, 30), at(11, 20), by)
        assert found.rows
    return len(queries.captured_queries)


@pytest.mark.parametrize("by", sorted(report.GROUPS))
def test_a_report_costs_the_same_queries_for_one_node_as_for_many(settings, by):
    settings.GPUFLEET_PRICE_GPU_HOUR, settings.GPUFLEET_PRICE_KWH = {"*": 2.0}, 0.1
    _rows(1)
    one = _queries(by)
    UsageHour.objects.all().delete()
    UsageFiveMinutes.objects.all().delete()
    _rows(40)
    assert _queries(by) == one == QUERIES


QUERIES = 2  # when the beat rolled last, then the groups (the total is their sum)


@pytest.mark.postgresql
def test_the_planner_is_told_which_key_columns_go_together():
    # Without them a month by claim was sorted on disk, over twice the time of its GROUP BY
    # (docs/performance.md, "Usage accounting").
    with connection.cursor() as cursor:
        cursor.execute("SELECT stxname, stxkeys::text FROM pg_statistic_ext WHERE stxrelid = 'usage_usagehour'::regclass"
                       " ORDER BY stxname")
        found = dict(cursor.fetchall())
    columns = {c.column: str(i + 1) for i, c in enumerate(UsageHour._meta.concrete_fields)}
    assert sorted(found) == ["usage_1h_claim_groups", "usage_1h_node_groups"]
    assert sorted(found["usage_1h_node_groups"].split()) == sorted(columns[c] for c in ("node_id", "node"))
