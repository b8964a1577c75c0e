"""gpufleet.tools.bench_history on a tiny fleet: it rolls a five-minute bucket and an hour
of every GPU, reports the seconds, the core fraction and the bytes per GPU-bucket of
each rollup series (PostgreSQL; on SQLite it says why not), and leaves nothing behind."""

from __future__ import annotations

import pytest
from django.db import connection

from gpufleet.fleet import history, partitions
from gpufleet.tools import bench_history
from tests.factories import ingest

pytestmark = pytest.mark.bench


def _state() -> dict:
    return {series.name: (series.model.objects.count(), [p.name for p in partitions.partitions(connection, series.table)])
            for series in history.SERIES}


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_it_measures_the_roll_up_and_the_bytes_kept_and_removes_what_it_wrote():
    ingest("alpha", 8)
    ingest("beta", 2)
    before = _state()
    figures, said = {}, []
    bench_history.measure_history(figures, said.append)
    assert set(figures) == set(bench_history.FIGURES)
    assert figures["history_value_bytes_per_gpu_bucket"] == 48
    assert figures["history_roll_5m_s"] > 0 and figures["history_roll_1h_s"] > 0
    assert figures["history_rollup_core_fraction"] == pytest.approx(
        figures["history_roll_5m_s"] / 300 + figures["history_roll_1h_s"] / 3600, abs=1e-3)
    # Ten GPUs fill no page: the figures only have to be there.
    assert all(figures[key] > 0 for key in ("history_5m_bytes_per_gpu_bucket", "history_1h_bytes_per_gpu_bucket",
                                            "history_raw_bytes_per_sample"))
    assert any("10 GPUs" in line for line in said)
    assert _state() == before
    targets = bench_history.history_targets(figures)
    assert set(targets) == {"history_rollups_at_most_3x_value_bytes", "history_rollup_at_most_10_percent_of_a_core"}
    assert targets["history_rollup_at_most_10_percent_of_a_core"] is True


@pytest.mark.django_db
def test_on_sqlite_it_says_why_it_measures_nothing():
    if connection.vendor == "postgresql":
        pytest.skip("about SQLite")
    figures, said = {}, []
    bench_history.measure_history(figures, said.append)
    assert figures == dict.fromkeys(bench_history.FIGURES)
    assert said == ["history figures skipped: the history's figures are of PostgreSQL's partitions"]
    assert bench_history.history_targets(figures) == {"history_rollups_at_most_3x_value_bytes": None,
                                                      "history_rollup_at_most_10_percent_of_a_core": None}
