"""Time partitions of the history tables, on PostgreSQL only.

Samples and their rollups are written in time order and thrown away in time order.
On PostgreSQL each of their tables is therefore partitioned by range of its time
column (plain declarative partitioning), and retention drops whole partitions,
which is a catalogue change, instead of deleting rows one by one (which at fleet
scale rewrites and vacuums hundreds of millions of rows a day). On SQLite the
tables stay plain and retention deletes rows (gpufleet/fleet/history.py).

Partitions start at whole multiples of their width counted from the Unix epoch in
UTC (so weekly ones start on a Thursday) and are named after their start, for
example `fleet_devicesample_20261203_2100`. Housekeeping makes them ahead of time.
Each table also has a DEFAULT partition, so a row that fits no partition (the
housekeeping stopped for hours, an agent's clock far ahead) is still stored; old
rows are deleted from it, and no partition is made over rows it holds (PostgreSQL
refuses to), so those stay there until they age out.

A partitioned table's primary key must hold its partition key: in the database
it is (id, <time column>), while Django keeps `id` as the model's primary key
(ids come from one sequence, so they stay unique). Identity columns are not
allowed on partitioned tables before PostgreSQL 17, so `id` takes its values
from a plain sequence instead.

DDL takes no query parameters: the bounds below are written into the statement
as literals, made from datetimes computed here, never from stored text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Layout:
    """How one table is partitioned: by which time column, in slices how long."""

    column: str
    width: timedelta


# Widths chosen so retention drops a small share of a series at a time and the
# partition count stays small: 6 h of raw samples in hourly slices, 7 days of
# five-minute rollups in daily ones, 90 days of hourly rollups in weekly ones.
LAYOUTS = {
    "fleet_devicesample": Layout("collected_at", timedelta(hours=1)),
    "fleet_noderollup5m": Layout("bucket", timedelta(days=1)),
    "fleet_noderollup1h": Layout("bucket", timedelta(days=7)),
}
# Partitions are made for the current slice and this many after it.
AHEAD = 3

_BOUNDS = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")


@dataclass(frozen=True)
class Partition:
    name: str
    # None for the DEFAULT partition (and for bounds this module did not write).
    start: datetime | None
    end: datetime | None


def supported(connection) -> bool:
    """Whether the history tables are partitioned on this database."""
    return connection.vendor == "postgresql"


def floor(at: datetime, width: timedelta) -> datetime:
    """The start of the slice of `width` (counted from the Unix epoch) that holds `at`."""
    return EPOCH + (at - EPOCH) // width * width


def default_name(table: str) -> str:
    return f"{table}_default"


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_{start.astimezone(UTC):%Y%m%d_%H%M}"


def partitions(connection, table: str) -> list[Partition]:
    """The partitions of `table`, by name, read from the catalogue."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            [table],
        )
        rows = cursor.fetchall()
    found = []
    for name, bound in rows:
        match = _BOUNDS.fullmatch(bound)
        start, end = (datetime.fromisoformat(v) for v in match.groups()) if match else (None, None)
        found.append(Partition(name, start, end))
    return found


def create_ahead(connection, table: str, now: datetime, since: datetime | None = None) -> list[str]:
    """Make the DEFAULT partition if missing and the partitions from the slice holding
    `since` (default `now`) to AHEAD slices after `now`'s; returns the names made. A
    slice that overlaps an existing partition, or whose rows the DEFAULT partition
    already holds, is left out."""
    layout = LAYOUTS[table]
    existing = partitions(connection, table)
    made = []
    with connection.cursor() as cursor:
        if not any(p.name == default_name(table) for p in existing):
            cursor.execute(f"CREATE TABLE {_q(connection, default_name(table))} PARTITION OF {_q(connection, table)} DEFAULT")
            made.append(default_name(table))
        start = floor(since or now, layout.width)
        last = floor(now, layout.width) + AHEAD * layout.width
        while start <= last:
            end = start + layout.width
            taken = any(p.start is not None and p.start < end and start < p.end for p in existing)
            if not taken and not _default_holds(connection, table, start, end):
                cursor.execute(
                    f"CREATE TABLE {_q(connection, partition_name(table, start))} PARTITION OF {_q(connection, table)}"
                    f" FOR VALUES FROM ({_literal(start)}) TO ({_literal(end)})"
                )
                made.append(partition_name(table, start))
            start = end
    return made


def drop_older(connection, table: str, cutoff: datetime) -> tuple[list[str], int]:
    """Drop the partitions of `table` that end at or before `cutoff` (wholly older),
    and delete older rows from its DEFAULT partition. Rows older than `cutoff` in the
    partition that straddles it stay until that whole partition is old enough.
    Returns the names dropped and the rows deleted from the DEFAULT partition."""
    column = LAYOUTS[table].column
    dropped = []
    deleted = 0
    with connection.cursor() as cursor:
        for partition in partitions(connection, table):
            if partition.name == default_name(table):
                cursor.execute(f"DELETE FROM {_q(connection, partition.name)} WHERE {column} < %s", [cutoff])
                deleted = cursor.rowcount
            elif partition.end is not None and partition.end <= cutoff:
                if not dropped:
                    # Rows written earlier in this transaction have their (deferred)
                    # foreign-key checks pending, and PostgreSQL drops no table with
                    # pending checks: run them now rather than at commit.
                    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(f"DROP TABLE {_q(connection, partition.name)}")
                dropped.append(partition.name)
    return dropped, deleted


def _default_holds(connection, table: str, start: datetime, end: datetime) -> bool:
    column = LAYOUTS[table].column
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {_q(connection, default_name(table))} WHERE {column} >= %s AND {column} < %s)",
            [start, end],
        )
        return cursor.fetchone()[0]


def _q(connection, name: str) -> str:
    return connection.ops.quote_name(name)


def _literal(at: datetime) -> str:
    return f"'{at.astimezone(UTC).isoformat()}'"
