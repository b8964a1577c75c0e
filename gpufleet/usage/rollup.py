"""The central beat's part of usage accounting: each finished hour's five-minute rows
rolled into hourly ones once, with the GPU time no snapshot covered counted as
unknown; and retention."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min, Sum
from django.utils import timezone

from gpufleet.fleet import partitions
from gpufleet.fleet.models import Node
from gpufleet.usage import record
from gpufleet.usage.models import UsageFiveMinutes, UsageHour
from gpufleet.usage.record import HOUR, UNKNOWN_KEY, rolled_until

# An hour is rolled this long after it ends: a snapshot collected at its end has been
# ingested by then (as the history's roll-up waits, gpufleet/fleet/history.py).
GRACE = timedelta(minutes=2)
# At most this many hours per run: a beat that stopped catches up without one long transaction.
ROLL_AT_MOST = 24


def roll(now: datetime | None = None) -> int:
    """Roll the finished hours not rolled yet, oldest first, at most ROLL_AT_MOST;
    returns the hourly rows written."""
    now = now or timezone.now()
    final = partitions.floor(now - GRACE, HOUR)
    start = rolled_until()
    if start is None:
        first = UsageFiveMinutes.objects.aggregate(first=Min("bucket"))["first"]
        if first is None:
            return 0
        start = partitions.floor(first, HOUR)
    written = 0
    for step in range(ROLL_AT_MOST):
        bucket = start + step * HOUR
        if bucket + HOUR > final:
            break
        with transaction.atomic():
            written += _roll_hour(bucket)
    return written


def _roll_hour(bucket: datetime) -> int:
    table, source = (connection.ops.quote_name(m._meta.db_table) for m in (UsageHour, UsageFiveMinutes))
    keys = ", ".join(["node_id", "node", *record.KEY_COLUMNS, "key"])
    sums = ", ".join(f"SUM({c})" for c in record.MEASURE_COLUMNS)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        # node, claim and owner are grouped too: the five-minute rows of one key hold the same names
        # but for a rename inside the hour, which then gives one row per name, ON CONFLICT keeping the first.
        cursor.execute(
            f"INSERT INTO {table} (bucket, {keys}, {', '.join(record.MEASURE_COLUMNS)})"
            f" SELECT %s, {keys}, {sums} FROM {source} WHERE bucket >= %s AND bucket < %s"
            f" GROUP BY {keys} ON CONFLICT (node_id, bucket, key) DO NOTHING",
            [adapt(bucket), adapt(bucket), adapt(bucket + HOUR)])
        written = cursor.rowcount
    return written + _unknown(bucket)


def _unknown(bucket: datetime) -> int:
    """One row per node whose snapshots covered less of the hour than its GPUs had
    (since it was first seen), by more than one collect interval's worth: that GPU
    time is unknown, neither used nor idle."""
    end = bucket + HOUR
    covered = dict(UsageFiveMinutes.objects.filter(bucket__gte=bucket, bucket__lt=end)
                   .values_list("node_id").annotate(seen=Sum("seen_s")).values_list("node_id", "seen"))
    slack = float(settings.GPUFLEET_COLLECT_INTERVAL)
    found = []
    nodes = Node.objects.filter(gpu_count__gt=0, first_seen__lt=end).values_list(
        "pk", "name", "gpu_models", "gpu_count", "first_seen")
    for node_id, name, models, gpus, first_seen in nodes.iterator(chunk_size=5000):
        span = (end - max(bucket, first_seen)).total_seconds()
        missing = gpus * span - covered.get(node_id, 0.0)
        if missing > gpus * slack:
            found.append(UsageHour(bucket=bucket, node_id=node_id, node=name, model=models, key=UNKNOWN_KEY,
                                   unknown_s=missing))
    UsageHour.objects.bulk_create(found, batch_size=1000, ignore_conflicts=True)
    return len(found)


def prune(now: datetime | None = None) -> dict[str, int]:
    """Rows older than their retention; five-minute rows only once rolled."""
    now = now or timezone.now()
    five = now - timedelta(hours=settings.GPUFLEET_USAGE_5M_HOURS)
    until = rolled_until()
    if until is not None:
        five = min(five, until)
    else:
        five = now - timedelta(days=settings.GPUFLEET_USAGE_DAYS)  # never rolled: keep them for the roll
    with transaction.atomic():
        fives, _ = UsageFiveMinutes.objects.filter(bucket__lt=five).delete()
        hours, _ = UsageHour.objects.filter(bucket__lt=now - timedelta(days=settings.GPUFLEET_USAGE_DAYS)).delete()
    return {"5m": fives, "1h": hours}
