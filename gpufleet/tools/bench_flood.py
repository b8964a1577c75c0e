"""The bench's flood figure: node B appends a flood through the ingest stream's append
function (junk the function refuses, entries naming a made-up node, entries naming node A
with bad signatures, entries signed with B's own key far past its cap, and zlib bombs),
then node A appends its next snapshot; one consumer in the bench's process handles the
stream until A's snapshot is stored. That delay is printed beside the collect interval
(the target: A misses no interval) and beside a floor from the same run: the same
entries read, acknowledged and deleted by the same Redis client without being handled.
gpufleet/tools/bench.py calls `measure_flood`, `flood_targets` and `table_rows`;
tests/integration/test_flood.py floods with `flood` too."""

from __future__ import annotations

import json
import os
import secrets
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings

from gpufleet import wire
from gpufleet.core import broker
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import Node
from gpufleet.ingest import stream as ingest_stream

FIGURES = ("flood_entries", "flood_delay_s", "flood_read_ack_floor_s", "ratio_flood_to_read_ack_floor")
NODE_A, NODE_B = "bench-flood-a", "bench-flood-b"
# One zlib bomb for this many entries of the flood.
ENTRIES_PER_BOMB = 2000
# Steps that find nothing while A's snapshot is still not stored, before the figure gives up.
IDLE_STEPS = 200

SnapshotOf = Callable[[str, datetime], dict]


def flood(key_b: wire.NodeKey, node_b: str, node_a: str, generation_a: int, size: int, bombs: int,
          snapshot_of: SnapshotOf) -> list[dict[bytes, bytes]]:
    """What node B appends: its two real snapshots, then `size` entries (a quarter each of
    junk, a made-up node's, node A's with bad signatures and B's own signed ones) with
    `bombs` spread among them, each a few kilobytes inflating to just under the per-entry bound."""
    now = datetime.now(UTC)
    own = [wire.encode_entry(key_b, node_b, wire.SNAPSHOT,
                             [wire.encode_snapshot(snapshot_of(node_b, now - timedelta(seconds=s))), None])
           for s in (20, 10)]
    room = wire.ENTRY_INFLATED_MAX - 64
    texts = ["a" * room, '{"node":"' + node_b + '","devices":[' + "{}," * (room // 3 - 20) + "{}]}"]
    bodies = [zlib.compress(json.dumps([text, None]).encode(), 9) for text in texts]
    small = zlib.compress(b'["{}",null]')
    junk = {b"junk": secrets.token_bytes(40)}
    made_up = {b"node": b"nobody", b"gen": b"1", b"kind": b"snapshot", b"sig": b"0" * 64, b"body": small}
    naming_a = {b"node": node_a.encode(), b"gen": str(generation_a).encode(), b"kind": b"snapshot",
                b"sig": secrets.token_hex(32).encode(), b"body": small}
    signed_b = wire.encode_entry(key_b, node_b, wire.SNAPSHOT, [wire.encode_snapshot(snapshot_of(node_b, now)), None])
    mix = [(junk, made_up, naming_a, signed_b)[i % 4] for i in range(size)]
    for i in range(bombs):
        mix.insert(i * (size // max(1, bombs)), wire.signed_entry(key_b, node_b, wire.SNAPSHOT, bodies[i % 2]))
    return [*own, *mix]


def append_all(client: redis.Redis, stream: str, entries: list[dict[bytes, bytes]], chunk: int = 1000) -> int:
    """Append `entries` through `stream`'s append function, pipelined as a hostile host
    would; how many the function refused (those not of an entry's fields)."""
    refused = 0
    for start in range(0, len(entries), chunk):
        with client.pipeline(transaction=False) as pipe:
            for fields in entries[start:start + chunk]:
                pipe.fcall(broker.append_function(stream), 0, *fields.values())
            refused += sum(isinstance(answer, redis.ResponseError) for answer in pipe.execute(raise_on_error=False))
    return refused


def measure_flood(figures: dict, client: redis.Redis, size: int, snapshot_of: SnapshotOf,
                  say: Callable[[str], None]) -> str | None:
    """Adds FIGURES to `figures`, on a stream of this run's own in `client`'s database;
    returns why they were not measured, or None."""
    name = f"gpufleet-bench-{os.getpid()}-flood:ingest"
    key = broker.ingest_key(name)
    try:
        if client.exists(key):
            return f"the stream {name!r} already holds entries that are not this run's"
        broker_users.prepare(client, name)
    except redis.RedisError as exc:
        return f"no Redis reachable ({exc})"
    try:
        key_a, key_b = credentials.enroll(NODE_A), credentials.enroll(NODE_B)
        first = snapshot_of(NODE_A, datetime.now(UTC) - timedelta(seconds=settings.GPUFLEET_COLLECT_INTERVAL))
        ingest_stream.in_process([wire.encode_entry(key_a, NODE_A, wire.SNAPSHOT, [wire.encode_snapshot(first), None])])
        consumer = ingest_stream.Consumer(client, stream=name, name="bench-flood", block_ms=10)
        consumer.ensure_group()
        entries = flood(key_b, NODE_B, NODE_A, key_a.generation, size, size // ENTRIES_PER_BOMB, snapshot_of)
        say(f"flooding the stream with {len(entries)} entries of one node ...")
        refused = append_all(client, name, entries)
        nxt = snapshot_of(NODE_A, datetime.now(UTC))
        append_all(client, name, [wire.encode_entry(key_a, NODE_A, wire.SNAPSHOT, [wire.encode_snapshot(nxt), None])])
        stored = Node.objects.filter(name=NODE_A, collected_at=nxt["collected_at"])
        began, idle = time.perf_counter(), 0
        while not stored.exists():
            idle = 0 if consumer.step() else idle + 1
            if idle > IDLE_STEPS:
                return "node A's snapshot was not stored behind the flood"
        delay = time.perf_counter() - began
        # The floor: the same entries through the same Redis, read and let go unhandled.
        append_all(client, name, entries)
        began = time.perf_counter()
        while got := client.xreadgroup(wire.INGEST_GROUP, "bench-floor", {key: ">"}, count=consumer.batch):
            ids = [entry_id for entry_id, _ in got[0][1]]
            client.xack(key, wire.INGEST_GROUP, *ids)
            client.xdel(key, *ids)
        floor = time.perf_counter() - began
    finally:
        admitted = list(client.scan_iter(match=f"{key}:admitted:*", count=1000))
        client.delete(key, broker.deleted_key(key), *admitted)
        client.function_delete(broker.append_function(name))
    figures["flood_entries"] = len(entries) - refused
    figures["flood_delay_s"] = float(f"{delay:.3g}")
    figures["flood_read_ack_floor_s"] = float(f"{floor:.3g}")
    figures["ratio_flood_to_read_ack_floor"] = round(delay / floor, 2)
    return None


def flood_targets(figures: dict) -> dict:
    """The flood's target, True met, False missed, None not measured: A's snapshot stored
    within the collect interval, so its node misses no interval."""
    delay = figures.get("flood_delay_s")
    return {"flood_delay_within_collect_interval": None if delay is None
            else delay <= settings.GPUFLEET_COLLECT_INTERVAL}


def table_rows(figures: dict) -> list[str]:
    delay, floor = figures.get("flood_delay_s"), figures.get("flood_read_ack_floor_s")
    if delay is None:
        return []
    interval = settings.GPUFLEET_COLLECT_INTERVAL
    ratio = figures["ratio_flood_to_read_ack_floor"]
    return [
        f"| a node's snapshot behind another's flood of {figures['flood_entries']:,} entries | {delay:.2f} s | "
        f"the collect interval | {interval:g} s | {delay / interval:.2f} |",
        f"| the same flood | {delay:.2f} s | the same entries read and acknowledged, unhandled | {floor:.2f} s | "
        f"{ratio:.2f} |",
    ]
