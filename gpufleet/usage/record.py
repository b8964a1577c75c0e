"""Ingest's part of usage accounting: each stored snapshot's GPU time, added into the
five-minute row of each of its keys (gpufleet/usage/models.py) in one statement per
batch."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection

from gpufleet.fleet import partitions
from gpufleet.gpu import accounting
from gpufleet.usage.models import UsageFiveMinutes

# A snapshot covers the time since the node's previous one, up to this many collect
# intervals; a longer gap is time the centre heard nothing, counted as unknown by the
# hourly roll, and the snapshot covers one interval.
LONGEST_COVERED = 2

KEY_COLUMNS = ["claim_id", "claim", "owner", "model", "image", "label"]
MEASURE_COLUMNS = ["seen_s", "used_s", "power_s", "energy_wh", "unknown_s"]
COLUMNS = ["bucket", "node_id", "node", *KEY_COLUMNS, "key", *MEASURE_COLUMNS]


@dataclass(frozen=True)
class Holder:
    """A claim as usage keeps it: its id, name and owner's user name."""

    id: int
    name: str
    owner: str


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
                  key.model[:500], key.image[:200], key.label[:200])
        found.append((bucket, node_id, node[:200], *values, key_digest(values),
                      seconds.seen, seconds.used, seconds.power_known, seconds.energy_wh, 0.0))
    return found


def add(found: list[tuple]) -> None:
    """Add `found` rows (COLUMNS) into the five-minute rows of their keys, in one
    statement on PostgreSQL. Rows of one node, bucket and key appear once (one
    snapshot per node in a batch, one line per key in a snapshot)."""
    if not found:
        return
    found = sorted(found, key=lambda row: (row[1], row[9]))  # one lock order for every writer
    table = connection.ops.quote_name(UsageFiveMinutes._meta.db_table)
    columns = ", ".join(COLUMNS)
    added = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in MEASURE_COLUMNS)
    # The names as they are now: a claim renamed, or given to another owner, this bucket.
    renamed = ", ".join(f"{c} = excluded.{c}" for c in ("node", "claim", "owner"))
    conflict = f" ON CONFLICT (node_id, bucket, key) DO UPDATE SET {added}, {renamed}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            types = ["timestamptz", "bigint", "text", "bigint", "text", "text", "text", "text", "text", "text",
                     "float8", "float8", "float8", "float8", "float8"]
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


