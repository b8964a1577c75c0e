"""The bench's sharded /metrics figures on a handful of nodes: shard 0 of the
recommended N timed through a logged-in client, every figure filled, and the target
read from them."""

from __future__ import annotations

import pytest

from gpufleet.api import metrics
from gpufleet.tools.bench_metrics import measure_metrics_shard, metrics_targets

pytestmark = [pytest.mark.django_db, pytest.mark.bench]


def test_it_times_shard_0_of_the_recommended_count(viewer_client, make_fleet, monkeypatch):
    make_fleet(5, gpus=2)
    figures: dict = {}
    measure_metrics_shard(viewer_client, figures, repeat=2)
    assert figures["metrics_shards"] == 1  # 10 GPUs: the whole fleet is one shard
    monkeypatch.setattr(metrics, "GPUS_PER_SHARD", 4)
    measure_metrics_shard(viewer_client, figures, repeat=2)
    assert figures["metrics_shards"] == 3
    assert figures["metrics_shard_scrape_s"] > 0
    assert figures["metrics_shard_scrape_bytes"] > 1000
    assert figures["metrics_shard_scrape_queries"] >= 2
    assert metrics_targets(figures) == {"metrics_shard_under_2_s": figures["metrics_shard_scrape_s"] < 2.0}


def test_the_target_is_unknown_until_measured():
    assert metrics_targets({}) == {"metrics_shard_under_2_s": None}
    assert metrics_targets({"metrics_shard_scrape_s": 2.5}) == {"metrics_shard_under_2_s": False}
