"""Per-GPU history that stays small: raw samples for a few hours, five-minute
rollups for days, hourly rollups for months, each with its own retention setting.

A rollup row holds one node's GPUs over one bucket, packed (gpufleet/gpu/rollups.py
says how). The central beat's housekeeping rolls each finished bucket up once, GRACE
after it ends (raw -> 5 min -> 1 h): the five-minute roll is one GROUP BY over the
bucket's raw samples, packed per node here; the hourly one combines each node's twelve
five-minute rows. It throws away what each series keeps no longer (by dropping
partitions on PostgreSQL, see partitions.py). A chart reads the coarsest series that
still gives each of its columns a point over its whole range, and the stretch that
series has not rolled yet from the finer one, so what the node page reads depends on
the range and the GPU count, never on how much history is stored."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import groupby, islice
from operator import itemgetter

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Max, Min
from django.utils import timezone

from gpufleet.fleet import charts, partitions
from gpufleet.fleet.models import Device, DeviceSample, Node, NodeRollup1h, NodeRollup5m
from gpufleet.gpu import rollups

log = logging.getLogger(__name__)

# The beat rolls every five minutes (settings.CELERY_BEAT_SCHEDULE "roll-history").
ROLL_EVERY = timedelta(minutes=5)
# A bucket is rolled once, this long after it ends: a snapshot collected at its end
# has been ingested by then (one collect interval, and a margin for the queue).
GRACE = timedelta(minutes=2)
# At most this many buckets per series and run, each in statements of bounded size: a
# beat that stopped for a while catches up twelve times faster than time passes.
ROLL_AT_MOST = 12
# Nodes per statement of the hourly roll, and per INSERT of either.
NODES_AT_ONCE = 1000


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
FIVE_MINUTES = Series("5m", NodeRollup5m, "bucket", "GPUFLEET_HISTORY_5M_DAYS", timedelta(days=1), source=RAW)
HOURLY = Series("1h", NodeRollup1h, "bucket", "GPUFLEET_HISTORY_HOURLY_DAYS", timedelta(days=1), source=FIVE_MINUTES)
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
    """Roll the buckets that are final up, each once: raw samples into five-minute
    rollups, those into hourly ones, at most ROLL_AT_MOST buckets each. Returns the
    rollup rows (one per node) written per series."""
    now = now or timezone.now()
    written = {}
    with transaction.atomic():
        for series in (FIVE_MINUTES, HOURLY):
            step = series.resolution
            start = partitions.floor(now - series.source.kept, step)
            last = series.model.objects.aggregate(last=Max("bucket"))["last"]
            if last is not None:
                start = max(start, last + step)
            final = partitions.floor(_final_until(series.source, now), step)
            written[series.name] = _roll(series, start, final, ROLL_AT_MOST)
    return written


def roll_between(start: datetime, end: datetime) -> dict[str, int]:
    """Roll every bucket from `start` that is final at `end`, those rolled already too,
    for history written into the past (gpufleet/tools/backfill.py): a node's rollup of a
    bucket rolled before stays as it was."""
    with transaction.atomic():
        return {series.name: _roll(series, start, partitions.floor(end - GRACE, series.resolution), None)
                for series in (FIVE_MINUTES, HOURLY)}


def _roll(series: Series, start: datetime, final: datetime, at_most: int | None) -> int:
    """Roll `series`' buckets from `start` on that end by `final`, but those its source
    has nothing in (a silent fleet, a stopped beat's gap), at most `at_most` of them."""
    source, step = series.source, series.resolution
    written = rolled = 0
    while at_most is None or rolled < at_most:
        first = source.model.objects.filter(**{f"{source.time_field}__gte": start}).aggregate(
            first=Min(source.time_field))["first"]
        if first is None:
            break
        bucket = partitions.floor(first, step)
        if bucket + step > final:
            break
        written += _roll_raw(bucket) if source is RAW else _roll_hour(bucket)
        rolled, start = rolled + 1, bucket + step
    return written


def _final_until(source: Series, now: datetime) -> datetime:
    """Until when `source` holds all it will: GRACE ago for the raw samples, the end of
    the last rolled bucket for a rollup."""
    if source is RAW:
        return now - GRACE
    last = source.model.objects.aggregate(last=Max("bucket"))["last"]
    return last + source.resolution if last is not None else now - source.kept


def _roll_raw(bucket: datetime) -> int:
    """The five-minute rollups of `bucket`: the database groups its raw samples by GPU
    (in node order), each node's GPUs are packed into its row."""
    q = connection.ops.quote_name
    sql = (
        "SELECT d.node_id, s.device_id, COUNT(*), "
        + ", ".join(", ".join(_measure_sql(m, "s.")) for m in DeviceSample.MEASURES)
        + f" FROM {q(RAW.table)} s JOIN {q(Device._meta.db_table)} d ON d.id = s.device_id"
        " WHERE s.collected_at >= %s AND s.collected_at < %s GROUP BY d.node_id, s.device_id ORDER BY 1, 2"
    )
    adapt = connection.ops.adapt_datetimefield_value
    # A server-side cursor on PostgreSQL: the fleet's GPUs stream through, a node at a time.
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, [adapt(bucket), adapt(bucket + FIVE_MINUTES.resolution)])
        nodes = (
            (node_id, rollups.pack((device_id, samples, figures) for _, device_id, samples, *figures in gpus))
            for node_id, gpus in groupby(_fetched(cursor), itemgetter(0))
        )
        return _write(FIVE_MINUTES, bucket, nodes)


def _roll_hour(bucket: datetime) -> int:
    """The hourly rollups of `bucket`, from each node's five-minute rows in it, read
    NODES_AT_ONCE nodes at a time."""
    node_ids = list(Node.objects.order_by("pk").values_list("pk", flat=True))
    end = bucket + HOURLY.resolution
    written = 0
    for at in range(0, len(node_ids), NODES_AT_ONCE):
        rows = NodeRollup5m.objects.filter(
            node_id__in=node_ids[at:at + NODES_AT_ONCE], bucket__gte=bucket, bucket__lt=end,
        ).order_by("node_id", "bucket").values_list("node_id", "figures")
        written += _write(HOURLY, bucket, (
            (node_id, rollups.merge([figures for _, figures in parts])) for node_id, parts in groupby(rows, itemgetter(0))
        ))
    return written


def _write(series: Series, bucket: datetime, nodes: Iterable[tuple[int, bytes]]) -> int:
    """One row of `series` per (node id, its GPUs' rollups packed), NODES_AT_ONCE per
    INSERT; a node's row there already (a run beside this one, a backfill) is left as
    it is. On PostgreSQL the rows go as two arrays, not as a Django object and three
    parameters each, which cost more than the rest of the roll-up's Python."""
    written = 0
    nodes = iter(nodes)
    while batch := list(islice(nodes, NODES_AT_ONCE)):
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    f"INSERT INTO {connection.ops.quote_name(series.table)} (node_id, bucket, figures)"
                    " SELECT unnest(%s::bigint[]), %s, unnest(%s::bytea[]) ON CONFLICT DO NOTHING",
                    [[node_id for node_id, _ in batch], bucket, [packed for _, packed in batch]],
                )
        else:
            series.model.objects.bulk_create(
                [series.model(node_id=node_id, bucket=bucket, figures=packed) for node_id, packed in batch],
                ignore_conflicts=True)
        written += len(batch)
    return written


def _fetched(cursor) -> Iterator[tuple]:
    while rows := cursor.fetchmany(2000):
        yield from rows


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
    """How far back a rollup may lag now: a bucket is rolled once its source holds all
    of it (GRACE after its end, for the raw samples), at the next beat."""
    lag = GRACE + ROLL_EVERY if series.source is RAW else tail(series.source)
    return series.resolution + lag


def chart_samples(devices: list[Device], start: datetime, now: datetime) -> dict[int, list[charts.Sample]]:
    """Each device's history from `start` to `now`, oldest first, as at most one point
    per chart column, by device id. From the series that fits the span, in one query;
    for a rollup, the stretch it may not have rolled yet (its `tail`, from a whole
    bucket on) comes from its source in a second query, so the chart reaches up to now."""
    series = series_for(now - start)
    column = max(timedelta(seconds=int((now - start).total_seconds() / charts.BUCKETS)), timedelta(seconds=1))
    if series.source is None:
        return _read_raw(devices, start, None, column, start)
    tail_start = max(start, partitions.floor(now - tail(series), series.resolution))
    found = _read_rollups(series, devices, start, tail_start, column, start)
    if series.source is RAW:
        more = _read_raw(devices, tail_start, None, column, start)
    else:
        more = _read_rollups(series.source, devices, tail_start, None, column, start)
    for device_id, samples in more.items():
        found[device_id].extend(samples)
    return found


def _read_rollups(series: Series, devices: list[Device], since: datetime, until: datetime | None,
                  column: timedelta, start: datetime) -> defaultdict[int, list[charts.Sample]]:
    """`series` rows of the devices' nodes from `since` until before `until` (None: no
    end), each GPU's combined into `column`-long stretches: their sample count, means
    and maxima."""
    found: defaultdict[int, list[charts.Sample]] = defaultdict(list)
    if not devices:
        return found
    nodes = sorted({d.node_id for d in devices})
    sql = (
        f"SELECT node_id, {_epoch_sql('bucket', column)}, figures FROM {connection.ops.quote_name(series.table)}"
        f" WHERE node_id IN ({', '.join(['%s'] * len(nodes))}) AND bucket >= %s"
        + (" AND bucket < %s" if until is not None else "") + " ORDER BY 1, 2"
    )
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(sql, [*nodes, adapt(since), *([adapt(until)] if until is not None else [])])
        rows = cursor.fetchall()
    wanted = {d.pk for d in devices}
    # Each node's rows of one stretch merged: all its GPUs at once.
    for (_, epoch), stretch in groupby(rows, itemgetter(0, 1)):
        # The first stretch may begin before the chart does: it is drawn at its start.
        at = max(datetime.fromtimestamp(epoch, UTC), start)
        for gpu in rollups.unpack(rollups.merge([packed for _, _, packed in stretch])):
            if gpu.device_id in wanted:
                found[gpu.device_id].append(charts.Sample(at, *gpu.means(), gpu.samples, *gpu.maxima()))
    return found


def _read_raw(devices: list[Device], since: datetime, until: datetime | None, column: timedelta,
              start: datetime) -> defaultdict[int, list[charts.Sample]]:
    """Raw samples of the devices from `since` until before `until` (None: no end),
    grouped by the database into `column`-long stretches: their count, means and maxima."""
    found: defaultdict[int, list[charts.Sample]] = defaultdict(list)
    if not devices:
        return found
    time = RAW.time_field
    measures = [_measure_sql(m) for m in DeviceSample.MEASURES]
    sql = (
        f"SELECT device_id, {_epoch_sql(time, column)}, COUNT(*), "
        + ", ".join(avg for _, avg, _ in measures) + ", " + ", ".join(high for _, _, high in measures)
        + f" FROM {connection.ops.quote_name(RAW.table)} WHERE {time} >= %s"
        + (f" AND {time} < %s" if until is not None else "")
        + f" AND device_id IN ({', '.join(['%s'] * len(devices))}) GROUP BY 1, 2 ORDER BY 1, 2"
    )
    adapt = connection.ops.adapt_datetimefield_value
    bounds = [adapt(since)] + ([adapt(until)] if until is not None else [])
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bounds, *(d.pk for d in devices)])
        rows = cursor.fetchall()
    for device_id, epoch, count, *values in rows:
        # The first stretch may begin before the chart does: it is drawn at its start.
        at = max(datetime.fromtimestamp(epoch, UTC), start)
        found[device_id].append(charts.Sample(at, *values[:4], count, *values[4:]))
    return found


def _epoch_sql(column: str, step: timedelta) -> str:
    """The start, in Unix seconds, of the `step`-long bucket (from the epoch) that holds `column`."""
    seconds = int(step.total_seconds())
    if connection.vendor == "postgresql":
        return f"CAST(floor(extract(epoch FROM {column}) / {seconds}) * {seconds} AS bigint)"
    # SQLite keeps datetimes as UTC text. ('%%s': the statement goes out with
    # parameters, so a literal % is doubled.)
    return f"CAST(strftime('%%s', {column}) AS INTEGER) / {seconds} * {seconds}"


def _measure_sql(measure: str, table: str = "") -> tuple[str, str, str]:
    """The minimum, mean and maximum of `measure` over a group of raw samples."""
    column = f"{table}{measure}"
    # The mean of floats: PostgreSQL's AVG of a bigint sums in numeric, far slower.
    return f"MIN({column})", f"AVG(CAST({column} AS DOUBLE PRECISION))", f"MAX({column})"
