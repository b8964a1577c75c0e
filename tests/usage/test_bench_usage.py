"""gpufleet.tools.bench_usage on a tiny fleet: a month of hourly usage rows made in SQL,
the Usage page (or report(), while there is no page) timed beside a plain GROUP BY of
the same rows by owner, image and claim, the roll of an hour of five-minute rows beside
the history's roll-up of an hour, the ratios and targets printed; nothing left behind
(PostgreSQL; on SQLite it says why not)."""

from __future__ import annotations

import pytest
from django.db import connection

from gpufleet.fleet.models import Node
from gpufleet.tools import bench_usage
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from tests.factories import ingest

pytestmark = pytest.mark.bench

TARGETS = {"usage_page_by_owner_within_2x_group_by", "usage_page_by_image_within_2x_group_by",
           "usage_page_by_claim_within_2x_group_by", "usage_roll_at_most_10_percent_of_history_roll"}


def _state() -> tuple:
    return UsageHour.objects.count(), UsageFiveMinutes.objects.count(), sorted(Node.objects.values_list("first_seen"))


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_it_times_a_month_beside_a_group_by_and_the_roll_beside_the_history(viewer_client):
    ingest("alpha", 8)
    ingest("beta", 2)
    before = _state()
    figures, said = {}, []
    assert bench_usage.measure_usage(viewer_client, figures, said.append, repeat=2) is None
    assert set(bench_usage.FIGURES) <= set(figures)
    # Two or three rows a node and hour.
    assert 2 * 720 * 2 <= figures["usage_hour_rows"] <= 2 * 720 * 3
    for by in bench_usage.GROUPINGS:
        assert figures[f"usage_{by}_ms"] > 0 and figures[f"usage_{by}_group_by_ms"] > 0
        assert figures[f"ratio_usage_{by}_to_group_by"] == pytest.approx(
            figures[f"usage_{by}_ms"] / figures[f"usage_{by}_group_by_ms"], rel=0.05)
        assert figures[f"usage_{by}_queries"] >= 1 and figures[f"usage_{by}_groups"] > 1
    # Claims a week long on two nodes over a month: a handful each, and the unreserved group.
    assert 4 < figures["usage_claim_groups"] < 20
    # Twelve buckets of the same keys, rolled into one hourly row per key; every GPU covered, so nothing unknown.
    assert 2 * 12 * 2 <= figures["usage_roll_5m_rows"] <= 2 * 12 * 3
    assert figures["usage_roll_1h_rows"] * 12 == figures["usage_roll_5m_rows"]
    assert figures["usage_roll_1h_s"] > 0
    # The bench had not measured the history: measured here, twelve five-minute rolls and an hourly one.
    assert any("rolling up five minutes of 10 GPUs" in line for line in said)
    assert figures["history_roll_hour_s"] > 0
    assert figures["ratio_usage_roll_to_history_roll"] == pytest.approx(
        figures["usage_roll_1h_s"] / figures["history_roll_hour_s"], rel=0.05, abs=0.01)
    assert _state() == before
    rows = bench_usage.table_rows(figures)
    ratios = [*(figures[f"ratio_usage_{by}_to_group_by"] for by in bench_usage.GROUPINGS),
              figures["ratio_usage_roll_to_history_roll"]]
    assert len(rows) == 4
    for row, by, ratio in zip(rows, [*bench_usage.GROUPINGS, None], ratios, strict=True):
        assert row.startswith(f"| usage, a month by {by} (" if by else "| usage roll-up, one hour of the fleet's")
        assert row.endswith(f" | {ratio:.2f} |")
    targets = bench_usage.usage_targets(figures)
    assert set(targets) == TARGETS and all(isinstance(met, bool) for met in targets.values())


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_it_reads_the_history_s_roll_up_from_the_bench_s_figures(viewer_client):
    ingest("alpha", 2)
    figures, said = {"history_roll_5m_s": 1.0, "history_roll_1h_s": 3.0}, []
    bench_usage.measure_usage(viewer_client, figures, said.append, repeat=1)
    assert figures["history_roll_hour_s"] == 15.0
    assert not any("rolling up" in line and "GPUs" in line for line in said)


@pytest.mark.django_db
def test_on_sqlite_it_says_why_it_measures_nothing(viewer_client):
    if connection.vendor == "postgresql":
        pytest.skip("about SQLite")
    figures, said = {}, []
    reason = bench_usage.measure_usage(viewer_client, figures, said.append, repeat=1)
    assert reason == "the usage rows are made with PostgreSQL's generate_series"
    assert figures == dict.fromkeys(bench_usage.FIGURES)
    assert said == [f"usage figures skipped: {reason}"]
    assert bench_usage.table_rows(figures) == []
    assert bench_usage.usage_targets(figures) == dict.fromkeys(TARGETS)
