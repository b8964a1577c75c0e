"""The bench's history figures, for the whole bench fleet (every current GPU): what the
housekeeping's roll-up costs a run, and the bytes each rollup series keeps per GPU and
bucket. PostgreSQL only (the figures are of its partitions). gpufleet/tools/bench.py
calls `measure_history` once the fleet is grown, and `history_targets`.

It writes into an hour long gone (HOURS_BACK ago), which no series keeps by default,
so nothing of the fleet's own history is in the way: one five-minute bucket of raw
samples at the 30 s collect interval (10 a GPU, one set-based INSERT: setup), timed
roll-up of it; the other eleven five-minute buckets of that hour as copies of the
first (setup), timed hourly roll-up. Then VACUUM ANALYZE and the partitions' sizes,
and all it wrote is removed again (the partitions it made dropped), so the pages the
bench measures afterwards see the database as it was."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from gpufleet.fleet import history, partitions
from gpufleet.fleet.models import Device
from gpufleet.gpu import rollups

# The targets: rollups within 3 x the bytes of their values (twelve float32
# figures a GPU and bucket), the roll-up within a tenth of one core.
VALUE_BYTES = 4 * rollups.FIGURES
AT_MOST_TIMES_VALUE_BYTES = 3
AT_MOST_CORE_FRACTION = 0.10
HOURS_BACK = 100 * 24
COLLECT_EVERY_S = 30

FIGURES = ("history_roll_5m_s", "history_roll_1h_s", "history_rollup_core_fraction", "history_5m_bytes_per_gpu_bucket",
           "history_1h_bytes_per_gpu_bucket", "history_value_bytes_per_gpu_bucket", "history_raw_bytes_per_sample")


def measure_history(figures: dict, say: Callable[[str], None]) -> str | None:
    """Adds FIGURES to `figures`; where they are not measured, None each, and returns why."""
    if connection.vendor != "postgresql":
        return _skip(figures, say, "the history's figures are of PostgreSQL's partitions")
    hour = partitions.floor(timezone.now() - timedelta(hours=HOURS_BACK), timedelta(hours=1))
    if _rows_within(hour):
        return _skip(figures, say, f"the hour from {hour:%Y-%m-%d %H:%M} holds history already")
    made = {series: partitions.create_ahead(connection, series.table, hour, since=hour) for series in history.SERIES}
    try:
        gpus = _raw_samples(hour)
        say(f"rolling up five minutes of {gpus} GPUs' samples ...")
        began = time.perf_counter()
        history.roll_between(hour, hour + history.FIVE_MINUTES.resolution + history.GRACE)
        roll_5m = time.perf_counter() - began
        _copy_five_minute_buckets(hour)
        say("rolling up their hour ...")
        began = time.perf_counter()
        history.roll_between(hour + history.FIVE_MINUTES.resolution, hour + history.HOURLY.resolution + history.GRACE)
        roll_1h = time.perf_counter() - began
        # To the 0.1 ms: a small fleet's roll-up takes milliseconds, which two decimals made 0.
        figures["history_roll_5m_s"] = round(roll_5m, 4)
        figures["history_roll_1h_s"] = round(roll_1h, 4)
        figures["history_rollup_core_fraction"] = round(roll_5m / 300 + roll_1h / 3600, 4)
        figures["history_5m_bytes_per_gpu_bucket"] = _bytes_per_gpu_bucket(history.FIVE_MINUTES, hour)
        figures["history_1h_bytes_per_gpu_bucket"] = _bytes_per_gpu_bucket(history.HOURLY, hour)
        figures["history_value_bytes_per_gpu_bucket"] = VALUE_BYTES
        figures["history_raw_bytes_per_sample"] = _raw_bytes_per_sample(hour)
    finally:
        _remove(hour, made)
    return None


def history_targets(figures: dict) -> dict:
    """The history targets: True met, False missed, None not measured."""
    sizes = [figures.get(f"history_{s}_bytes_per_gpu_bucket") for s in ("5m", "1h")]
    fraction = figures.get("history_rollup_core_fraction")
    return {
        "history_rollups_at_most_3x_value_bytes":
            None if None in sizes else all(size <= AT_MOST_TIMES_VALUE_BYTES * VALUE_BYTES for size in sizes),
        "history_rollup_at_most_10_percent_of_a_core": None if fraction is None else fraction <= AT_MOST_CORE_FRACTION,
    }


def _skip(figures: dict, say: Callable[[str], None], reason: str) -> str:
    for key in FIGURES:
        figures[key] = None
    say(f"history figures skipped: {reason}")
    return reason


def _rows_within(hour) -> bool:
    end = hour + timedelta(hours=1)
    return any(series.model.objects.filter(**{f"{series.time_field}__gte": hour, f"{series.time_field}__lt": end}).exists()
               for series in history.SERIES)


def _raw_samples(hour) -> int:
    """Ten samples of every current GPU in the hour's first five minutes, in one statement
    (foreign keys checked as it goes, not queued to the commit); returns the GPUs."""
    table = connection.ops.quote_name(history.RAW.table)
    samples = int(history.FIVE_MINUTES.resolution.total_seconds()) // COLLECT_EVERY_S
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(
            f"INSERT INTO {table} (device_id, collected_at, vram_used_mib, utilization_percent, temperature_c, power_draw_w)"
            f" SELECT d.id, %s + k * interval '{COLLECT_EVERY_S} seconds', 20000 + (d.id * 7919 + k * 104729) %% 60000,"
            " (d.id + k * 13) %% 101, 30 + (d.id + k) %% 50, 100 + ((d.id * 31 + k * 17) %% 6000) / 10.0"
            f" FROM {connection.ops.quote_name(Device._meta.db_table)} d CROSS JOIN generate_series(0, {samples - 1}) k"
            " WHERE d.vanished_at IS NULL",
            [hour],
        )
        return cursor.rowcount // samples


def _copy_five_minute_buckets(hour) -> None:
    """The hour's other eleven five-minute buckets as copies of its first, a bucket per
    statement in node order, as the roll-up writes them."""
    table = connection.ops.quote_name(history.FIVE_MINUTES.table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for n in range(1, 12):
            cursor.execute(f"INSERT INTO {table} (node_id, bucket, figures) SELECT node_id, bucket + interval '{5 * n}"
                           f" minutes', figures FROM {table} WHERE bucket = %s ORDER BY node_id", [hour])


def _bytes_per_gpu_bucket(series: history.Series, hour) -> float:
    """pg_total_relation_size (rows, indexes, TOAST) of the series' partition holding
    `hour`, after VACUUM ANALYZE, over the GPU-buckets it holds."""
    width = partitions.LAYOUTS[series.table].width
    name = partitions.partition_name(series.table, partitions.floor(hour, width))
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {quoted}")
        cursor.execute(f"SELECT pg_total_relation_size(%s), SUM(length(figures)) FROM {quoted}", [name])
        size, packed = cursor.fetchone()
    return round(size / (packed / rollups.GPU_BYTES), 1)


def _raw_bytes_per_sample(hour) -> float:
    name = partitions.partition_name(history.RAW.table, hour)
    quoted = connection.ops.quote_name(name)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {quoted}")
        cursor.execute(f"SELECT pg_total_relation_size(%s), COUNT(*) FROM {quoted}", [name])
        size, rows = cursor.fetchone()
    return round(size / rows, 1)


def _remove(hour, made: dict) -> None:
    """The partitions made here dropped, and what was written into others deleted."""
    end = hour + timedelta(hours=1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for series, names in made.items():
            for name in names:
                if name != partitions.default_name(series.table):
                    cursor.execute(f"DROP TABLE {connection.ops.quote_name(name)}")
            series.model.objects.filter(**{f"{series.time_field}__gte": hour, f"{series.time_field}__lt": end}).delete()
