"""Per-GPU history that stays small: raw samples for a few hours, five-minute
rollups for days, hourly rollups for months, each with its own retention setting.

The central beat's housekeeping rolls finished buckets up (raw -> 5 min -> 1 h)
with one set-based INSERT ... SELECT ... GROUP BY per series, and throws away what
each series keeps no longer (by dropping partitions on PostgreSQL, see
partitions.py). A chart reads the coarsest series that still gives each of its
columns a point over its whole range, so what the node page reads depends on the
range and the GPU count, never on how much history is stored."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Max, Min
from django.utils import timezone

from gpufleet.fleet import charts, partitions
from gpufleet.fleet.models import DeviceSample, DeviceSample1h, DeviceSample5m

log = logging.getLogger(__name__)

# The beat rolls every five minutes (settings.CELERY_BEAT_SCHEDULE "roll-history").
ROLL_EVERY = timedelta(minutes=5)
# At most this many buckets per series and run: a beat that stopped for a while
# catches up twelve times faster than time passes, in statements of bounded size.
ROLL_AT_MOST = 12


@dataclass(frozen=True)
class Series:
    """One of the three stored series of GPU history."""

    name: str
    model: type[models.Model]
    time_field: str
    # How long it is kept: the named setting times `keep_unit`.
    keep_setting: str
    keep_unit: timedelta
    # What it is rolled up from (None: the raw samples, written by ingest).
    source: Series | None = None

    @property
    def table(self) -> str:
        return self.model._meta.db_table

    @property
    def resolution(self) -> timedelta:
        if self.source is None:  # one sample per collection
            return timedelta(seconds=settings.GPUFLEET_COLLECT_INTERVAL)
        return self.model.resolution

    @property
    def kept(self) -> timedelta:
        return getattr(settings, self.keep_setting) * self.keep_unit


RAW = Series("raw", DeviceSample, "collected_at", "GPUFLEET_HISTORY_RAW_HOURS", timedelta(hours=1))
FIVE_MINUTES = Series("5m", DeviceSample5m, "bucket", "GPUFLEET_HISTORY_5M_DAYS", timedelta(days=1), source=RAW)
HOURLY = Series("1h", DeviceSample1h, "bucket", "GPUFLEET_HISTORY_HOURLY_DAYS", timedelta(days=1), source=FIVE_MINUTES)
SERIES = (RAW, FIVE_MINUTES, HOURLY)  # finest first


# --- Housekeeping --------------------------------------------------------------


def prepare_partitions(now: datetime | None = None, since: datetime | None = None) -> list[str]:
    """Make each series' partitions ahead of time, and back to `since` when given but
    never further back than the series is kept (PostgreSQL); returns the names made."""
    if not partitions.supported(connection):
        return []
    now = now or timezone.now()
    made = []
    with transaction.atomic():
        for series in SERIES:
            back = None if since is None else max(since, now - series.kept)
            made += partitions.create_ahead(connection, series.table, now, since=back)
    return made


def roll(now: datetime | None = None) -> dict[str, int]:
    """Roll the finished buckets up: raw samples into five-minute rollups, those into
    hourly ones. Returns the rollup rows written (new or rewritten) per series."""
    now = now or timezone.now()
    with transaction.atomic():
        return {series.name: _roll(series, now) for series in (FIVE_MINUTES, HOURLY)}


def _roll(series: Series, now: datetime) -> int:
    source, step = series.source, series.resolution
    last = series.model.objects.aggregate(last=Max("bucket"))["last"]
    if last is not None:
        # The last bucket is rolled again: samples that arrived late (a snapshot in
        # flight at the bucket's end) count too. Each bucket is rewritten, never added to.
        start, first_new = last, last + step
    else:
        oldest = source.model.objects.aggregate(oldest=Min(source.time_field))["oldest"]
        if oldest is None:
            return 0
        start = first_new = partitions.floor(oldest, step)
    start = max(start, partitions.floor(now - source.kept, step))
    end = min(partitions.floor(_covered_until(source, now), step), max(start, first_new) + ROLL_AT_MOST * step)
    if start >= end:
        return 0
    sql = (
        f"INSERT INTO {connection.ops.quote_name(series.table)} (device_id, bucket, samples, {_ROLLUP_COLUMNS})"
        f" SELECT device_id, {_bucket_sql(source.time_field, step)}, {_count_sql(source)}, "
        + ", ".join(", ".join(_measure_sql(source, m)) for m in DeviceSample.MEASURES)
        + f" FROM {connection.ops.quote_name(source.table)} WHERE {source.time_field} >= %s AND {source.time_field} < %s"
        f" GROUP BY 1, 2 {_UPSERT}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [connection.ops.adapt_datetimefield_value(start), connection.ops.adapt_datetimefield_value(end)])
        return cursor.rowcount


def _covered_until(source: Series, now: datetime) -> datetime:
    """Until when `source` is complete: now for the raw samples, the end of the last
    rolled bucket for a rollup."""
    if source is RAW:
        return now
    last = source.model.objects.aggregate(last=Max("bucket"))["last"]
    return last + source.resolution if last is not None else now - source.kept


def _epoch_sql(column: str, step: timedelta) -> str:
    """The start, in Unix seconds, of the `step`-long bucket (from the epoch) that holds `column`."""
    seconds = int(step.total_seconds())
    if connection.vendor == "postgresql":
        return f"CAST(floor(extract(epoch FROM {column}) / {seconds}) * {seconds} AS bigint)"
    # SQLite keeps datetimes as UTC text. ('%%s': the statement goes out with
    # parameters, so a literal % is doubled.)
    return f"CAST(strftime('%%s', {column}) AS INTEGER) / {seconds} * {seconds}"


def _bucket_sql(column: str, step: timedelta) -> str:
    """The same bucket start as a datetime, as the rollup tables keep it."""
    if connection.vendor == "postgresql":
        return f"to_timestamp({_epoch_sql(column, step)})"
    return f"datetime({_epoch_sql(column, step)}, 'unixepoch')"


def _count_sql(source: Series) -> str:
    return "COUNT(*)" if source is RAW else "SUM(samples)"


def _measure_sql(source: Series, measure: str) -> tuple[str, str, str]:
    """The minimum, mean and maximum of `measure` over a group of `source` rows. Of
    rollups, the mean is their means weighted by their sample counts (exact unless a
    measure was missing from only some samples of a bucket)."""
    if source is RAW:
        return f"MIN({measure})", f"CAST(AVG({measure}) AS DOUBLE PRECISION)", f"MAX({measure})"
    weighted = f"SUM({measure}_avg * samples) / SUM(CASE WHEN {measure}_avg IS NOT NULL THEN samples END)"
    return f"MIN({measure}_min)", weighted, f"MAX({measure}_max)"


_ROLLUP_COLUMNS = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in DeviceSample.MEASURES)
_UPSERT = "ON CONFLICT (device_id, bucket) DO UPDATE SET samples = excluded.samples, " + ", ".join(
    f"{m}_{s} = excluded.{m}_{s}" for m in DeviceSample.MEASURES for s in ("min", "avg", "max")
)


@dataclass(frozen=True)
class Pruned:
    """What retention removed from one series: whole partitions (PostgreSQL) and rows."""

    series: str
    partitions: tuple[str, ...]
    rows: int


def prune(now: datetime | None = None) -> list[Pruned]:
    """Remove what each series keeps no longer. On PostgreSQL whole partitions go
    (those wholly older than the series' retention) and only rows in the DEFAULT
    partition are deleted; on SQLite rows are deleted."""
    now = now or timezone.now()
    pruned = []
    with transaction.atomic():
        for series in SERIES:
            cutoff = now - series.kept
            if partitions.supported(connection):
                dropped, rows = partitions.drop_older(connection, series.table, cutoff)
            else:
                dropped = []
                rows, _ = series.model.objects.filter(**{f"{series.time_field}__lt": cutoff}).delete()
            pruned.append(Pruned(series.name, tuple(dropped), rows))
    return pruned


# --- Reading, for the charts -----------------------------------------------------


def series_for(span: timedelta) -> Series:
    """The series a chart over `span` reads: the coarsest that still gives each chart
    column a point, or, where that one is not kept for the whole span, the next
    coarser one that is (the coarsest of all if none is)."""
    fine_enough = [s for s in SERIES if s.resolution <= span / charts.BUCKETS] or [RAW]
    for series in SERIES[SERIES.index(fine_enough[-1]):]:
        if series.kept >= span:
            return series
    return SERIES[-1]


def tail(series: Series) -> timedelta:
    """How far back a rollup may lag its source: its last bucket ends up to one
    resolution before now and is rolled up to one beat period later."""
    return 2 * series.resolution + ROLL_EVERY


def chart_samples(device_ids: list[int], start: datetime, now: datetime) -> dict[int, list[charts.Sample]]:
    """Each device's history from `start` to `now`, oldest first, as at most one point
    per chart column (the database groups the rows). From the series that fits the
    span, in one query; for a rollup, the stretch it may not have rolled yet (its
    `tail`) comes from its source in a second query, so the chart reaches up to now."""
    series = series_for(now - start)
    column = max(timedelta(seconds=int((now - start).total_seconds() / charts.BUCKETS)), timedelta(seconds=1))
    if series.source is None:
        return _read(series, device_ids, start, None, column, start)
    tail_start = max(start, now - tail(series))
    found = _read(series, device_ids, start, tail_start, column, start)
    for device_id, samples in _read(series.source, device_ids, tail_start, None, column, start).items():
        found[device_id].extend(samples)
    return found


def _read(series: Series, device_ids: list[int], since: datetime, until: datetime | None, column: timedelta,
          start: datetime) -> defaultdict[int, list[charts.Sample]]:
    """`series` rows of the devices from `since` until before `until` (None: no end),
    grouped into `column`-long stretches: their sample count, means and maxima."""
    found: defaultdict[int, list[charts.Sample]] = defaultdict(list)
    if not device_ids:
        return found
    time = series.time_field
    measures = [_measure_sql(series, m) for m in DeviceSample.MEASURES]
    sql = (
        f"SELECT device_id, {_epoch_sql(time, column)}, {_count_sql(series)}, "
        + ", ".join(avg for _, avg, _ in measures) + ", " + ", ".join(high for _, _, high in measures)
        + f" FROM {connection.ops.quote_name(series.table)} WHERE {time} >= %s"
        + (f" AND {time} < %s" if until is not None else "")
        + f" AND device_id IN ({', '.join(['%s'] * len(device_ids))}) GROUP BY 1, 2 ORDER BY 1, 2"
    )
    adapt = connection.ops.adapt_datetimefield_value
    bounds = [adapt(since)] + ([adapt(until)] if until is not None else [])
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bounds, *device_ids])
        rows = cursor.fetchall()
    for device_id, epoch, count, *values in rows:
        # The first stretch may begin before the chart does: it is drawn at its start.
        at = max(datetime.fromtimestamp(epoch, UTC), start)
        found[device_id].append(charts.Sample(at, *values[:4], count, *values[4:]))
    return found
