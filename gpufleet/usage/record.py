"""Ingest's part of usage accounting: each stored snapshot's GPU time, added into the
five-minute row of each of its keys (gpufleet/usage/models.py) in one statement per
batch. A snapshot stored after the beat rolled its hour (the backlog of consumers
that were down) is added into the hourly rows as well, and the time it covers taken
off the hour's unknown time."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import Max
from django.utils import timezone

from gpufleet.fleet import partitions
from gpufleet.gpu import accounting
from gpufleet.usage.models import UsageFiveMinutes, UsageHour, UsageRow

# A snapshot covers the time since the node's previous one, up to this many collect
# intervals; a longer gap is time the centre heard nothing, counted as unknown by the
# hourly roll, and the snapshot covers one interval.
LONGEST_COVERED = 2

HOUR = UsageHour.resolution
# The key of a node's hourly row of GPU time no snapshot covered.
UNKNOWN_KEY = "unknown"

KEY_COLUMNS = ["claim_id", "claim", "owner", "team", "model", "image", "label"]
MEASURE_COLUMNS = ["seen_s", "used_s", "power_s", "energy_wh", "unknown_s"]
COLUMNS = ["bucket", "node_id", "node", *KEY_COLUMNS, "key", *MEASURE_COLUMNS]
_KEY = COLUMNS.index("key")


@dataclass(frozen=True)
class Holder:
    """A claim as usage keeps it: its id, name, owner's user name and team's name."""

    id: int
    name: str
    owner: str
    team: str


def covered(previous: datetime | None, at: datetime) -> float:
    """The seconds a snapshot taken `at` covers, after the node's one taken `previous`."""
    interval = float(settings.GPUFLEET_COLLECT_INTERVAL)
    if previous is None:
        return interval
    gap = (at - previous).total_seconds()
    return gap if 0 < gap <= LONGEST_COVERED * interval else interval


def key_digest(values: Sequence) -> str:
    return hashlib.blake2b(repr(tuple(values)).encode(), digest_size=16).hexdigest()


def rows(node_id: int, node: str, at: datetime, holders: Sequence[Holder],
         lines: dict[accounting.Key, accounting.Seconds]) -> list[tuple]:
    """The five-minute rows (COLUMNS) of one snapshot's `lines`, taken `at`."""
    bucket = partitions.floor(at, UsageFiveMinutes.resolution)
    found = []
    for key, seconds in lines.items():
        holder = holders[key.claim] if key.claim is not None else None
        values = (holder.id if holder else None, holder.name if holder else "", holder.owner if holder else "",
                  holder.team if holder else "", key.model[:500], key.image[:200], key.label[:200])
        found.append((bucket, node_id, node[:200], *values, key_digest(values),
                      seconds.seen, seconds.used, seconds.power_known, seconds.energy_wh, 0.0))
    return found


def rolled_until() -> datetime | None:
    """The end of the last hour the beat rolled (None: none yet)."""
    last = UsageHour.objects.aggregate(last=Max("bucket"))["last"]
    return last + HOUR if last is not None else None


def add(found: list[tuple]) -> None:
    """Add `found` rows (COLUMNS) into the five-minute rows of their keys, in one
    statement on PostgreSQL. Rows of one node, bucket and key appear once (one
    snapshot per node in a batch, one line per key in a snapshot). Those of an hour
    rolled already go into its hourly rows too."""
    if not found:
        return
    found = sorted(found, key=lambda row: (row[1], row[_KEY]))  # one lock order for every writer
    _upsert(UsageFiveMinutes, found)
    # Only a row of an hour that has ended can be late: most batches ask nothing more.
    now = timezone.now()
    if not any(partitions.floor(row[0], HOUR) + HOUR <= now for row in found):
        return
    until = rolled_until()
    late = [(partitions.floor(row[0], HOUR), *row[1:]) for row in found if until is not None and row[0] < until]
    if late:
        _upsert(UsageHour, late)
        _known(late)


def _upsert(model: type[UsageRow], found: list[tuple]) -> None:
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(COLUMNS)
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in MEASURE_COLUMNS)
    # The names as they are now: a claim renamed, or given to another owner, this bucket.
    renamed = ", ".join(f"{c} = excluded.{c}" for c in ("node", "claim", "owner"))
    conflict = f" ON CONFLICT (node_id, bucket, key) DO UPDATE SET {added}, {renamed}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            types = ["timestamptz", "bigint", "text", "bigint", *["text"] * (len(KEY_COLUMNS) - 1), "text",
                     *["float8"] * len(MEASURE_COLUMNS)]
            arrays = ", ".join(f"%s::{t}[]" for t in types)
            cursor.execute(f"INSERT INTO {table} ({columns}) SELECT * FROM unnest({arrays}){conflict}",
                           [list(column) for column in zip(*found, strict=True)])
            return
        adapt = connection.ops.adapt_datetimefield_value
        for at in range(0, len(found), 1000):
            chunk = found[at:at + 1000]
            values = ", ".join(["(" + ", ".join(["%s"] * len(COLUMNS)) + ")"] * len(chunk))
            cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values}{conflict}",
                           [v for row in chunk for v in (adapt(row[0]), *row[1:])])


def _known(late: list[tuple]) -> None:
    """Take the GPU time `late` hourly rows cover off their node's unknown time that hour,
    which the beat counted while their snapshots were not stored yet."""
    seen: dict[tuple[int, datetime], float] = defaultdict(float)
    for row in late:
        seen[row[1], row[0]] += row[COLUMNS.index("seen_s")]
    table = connection.ops.quote_name(UsageHour._meta.db_table)
    less = "CASE WHEN unknown_s > v.seen THEN unknown_s - v.seen ELSE 0 END"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            nodes, buckets, seconds = zip(*((node, bucket, s) for (node, bucket), s in seen.items()), strict=True)
            cursor.execute(
                f"UPDATE {table} SET unknown_s = {less}"
                " FROM unnest(%s::bigint[], %s::timestamptz[], %s::float8[]) AS v(node_id, bucket, seen)"
                f" WHERE {table}.node_id = v.node_id AND {table}.bucket = v.bucket AND {table}.key = %s",
                [list(nodes), list(buckets), list(seconds), UNKNOWN_KEY])
            return
        adapt = connection.ops.adapt_datetimefield_value
        for (node, bucket), seconds in seen.items():
            cursor.execute(f"UPDATE {table} SET unknown_s = {less.replace('v.seen', '%s')}"
                           " WHERE node_id = %s AND bucket = %s AND key = %s",
                           [seconds, seconds, node, adapt(bucket), UNKNOWN_KEY])
