"""The bench's flood figure on a small flood and a redis-server of the test's own: node A's
snapshot stored behind node B's flood, timed beside the same entries only read and
acknowledged, the target read from it, and nothing of the run left in Redis."""

from __future__ import annotations

import pytest

from gpufleet.core import broker
from gpufleet.tools import bench_flood
from tests.factories import snapshot
from tests.integration.conftest import own_redis  # noqa: F401  (a redis-server of the test's own)

pytestmark = [pytest.mark.django_db, pytest.mark.bench]


def test_it_times_a_node_s_snapshot_behind_another_node_s_flood_beside_its_floor(own_redis, settings):  # noqa: F811
    settings.GPUFLEET_COLLECT_INTERVAL = 30.0
    client = broker.connect(own_redis.url, timeout=5, retries=0)
    before = set(client.keys()), len(client.function_list())
    figures: dict = {}
    said: list[str] = []
    assert bench_flood.measure_flood(figures, client, 4000, lambda node, at: snapshot(node, 1, at=at), said.append) is None
    # A quarter of the flood is junk, which the append function refuses.
    assert figures["flood_entries"] == 2 + 2 + 4000 * 3 // 4
    assert figures["flood_delay_s"] > 0 and figures["flood_read_ack_floor_s"] > 0
    assert figures["ratio_flood_to_read_ack_floor"] == pytest.approx(
        figures["flood_delay_s"] / figures["flood_read_ack_floor_s"], rel=0.05, abs=0.05)
    assert bench_flood.flood_targets(figures) == {"flood_delay_within_collect_interval": figures["flood_delay_s"] <= 30}
    assert [row.split(" | ")[2] for row in bench_flood.table_rows(figures)] == [
        "the collect interval", "the same entries read and acknowledged, unhandled"]
    assert (set(client.keys()), len(client.function_list())) == before


def test_without_redis_it_says_why(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 30.0
    client = broker.connect("redis://127.0.0.1:1/0", timeout=1, retries=0)
    figures: dict = {}
    assert bench_flood.measure_flood(figures, client, 10, snapshot, print).startswith("no Redis reachable")
    assert figures == {} and bench_flood.flood_targets(figures) == {"flood_delay_within_collect_interval": None}
    assert bench_flood.table_rows(figures) == []
