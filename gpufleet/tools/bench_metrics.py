"""The bench's sharded /metrics figures: a scrape of shard 0 of the N shards that
docs/metrics.md recommends for the fleet in the database (gpufleet.api.metrics.shards_for),
as Prometheus scrapes a large fleet, through the bench's logged-in test client.
gpufleet/tools/bench.py calls `measure_metrics_shard` and `metrics_targets`."""

from __future__ import annotations

import statistics
import time

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from gpufleet.api.metrics import shards_for
from gpufleet.fleet.models import Device

# The fleet-scale issue's target for one shard's scrape.
SHARD_SCRAPE_TARGET_S = 2.0


def measure_metrics_shard(client: Client, figures: dict, repeat: int) -> None:
    """Time shard 0 of the recommended N: the median of `repeat` scrapes after one
    untimed (imports, caches). Adds metrics_shards, metrics_shard_scrape_s,
    metrics_shard_scrape_bytes and metrics_shard_scrape_queries to `figures`."""
    count = shards_for(Device.objects.filter(vanished_at__isnull=True).count())
    url = f"/metrics?shard=0&of={count}"
    runs = [timed_get(client, url) for _ in range(max(1, repeat) + 1)][1:]
    figures["metrics_shards"] = count
    figures["metrics_shard_scrape_s"] = round(statistics.median(seconds for seconds, _, _ in runs), 3)
    figures["metrics_shard_scrape_queries"] = runs[-1][1]
    figures["metrics_shard_scrape_bytes"] = runs[-1][2]


def metrics_targets(figures: dict) -> dict:
    """The shard target: True met, False missed, None not measured."""
    seconds = figures.get("metrics_shard_scrape_s")
    return {"metrics_shard_under_2_s": None if seconds is None else seconds < SHARD_SCRAPE_TARGET_S}


def timed_get(client: Client, url: str, headers: dict | None = None) -> tuple[float, int, int]:
    """Seconds, queries and body bytes of one GET that must answer 200 (a streamed body
    read to its end); the bench times its pages with it too."""
    with CaptureQueriesContext(connection) as queries:
        began = time.perf_counter()
        response = client.get(url, **(headers or {}))
        body = b"".join(response) if response.streaming else response.content
        elapsed = time.perf_counter() - began
    if response.status_code != 200:
        raise RuntimeError(f"GET {url} answered {response.status_code}")
    return elapsed, len(queries), len(body)
