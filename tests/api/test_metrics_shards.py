"""/metrics?shard=K&of=N: a node is in shard crc32(name) % N; the shards are disjoint and
together are the unsharded scrape, site-wide series (ingest, broker) in shard 0 only;
bad parameters answer 400 in words; two queries whatever the fleet's or the shard's size;
the scrape_configs that docs/metrics.md shows scrape each shard once."""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest
import yaml
from django.test import Client
from markdown_it import MarkdownIt
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.alerts.models import Channel
from gpufleet.api import metrics
from gpufleet.api.metrics import MAX_SHARDS, Shard, render, shard_of, shards_for
from gpufleet.ingest.metrics import record_batch, record_snapshot

pytestmark = pytest.mark.django_db

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _nodes(samples: dict) -> set[str]:
    return {dict(labels)["node"] for _, labels in samples if "node" in dict(labels)}


def test_a_node_s_shard_is_the_crc32_of_its_name_the_same_in_every_process():
    # Pinned values: Python's hash() of a str is salted per process, so a scrape served by
    # another worker, or after an upgrade of Python, would put nodes in other shards.
    assert [shard_of(name, 1000) for name in ("node-00", "gpu-a01", "Ünïcode-node")] == [9, 526, 151]
    assert shard_of("node-00", 7) == zlib.crc32(b"node-00") % 7
    assert shard_of("anything", 1) == 0


def test_the_shards_are_disjoint_and_together_are_the_whole_scrape(make_fleet, settings):
    make_fleet(12, gpus=2)
    record_snapshot("accepted")
    record_batch(1, 0.01)
    whole = _samples(render().decode())
    for count in (1, 3, 5):
        union: dict = {}
        for index in range(count):
            shard = _samples(render(Shard(index, count)).decode())
            assert not set(shard) & set(union), f"shard {index} of {count} repeats series of another"
            union |= shard
            assert all(shard_of(node, count) == index for node in _nodes(shard))
        assert union == whole
    assert len(_nodes(whole)) == 12


def test_site_wide_series_come_in_shard_0_only(make_fleet, settings, monkeypatch):
    make_fleet(4, gpus=1)
    Channel.objects.create(name="ops", url="json://hooks.example.com/x", redacted="json://…")
    record_snapshot("accepted")
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    monkeypatch.setattr(metrics.broker, "stream_status", lambda client, stream=None: (3, 0))
    first = {name for name, _ in _samples(render(Shard(0, 2)).decode())}
    second = {name for name, _ in _samples(render(Shard(1, 2)).decode())}
    site_wide = {"gpufleet_broker_up", "gpufleet_broker_queue_depth", "gpufleet_ingest_snapshots_total",
                 "gpufleet_alert_channel_failing"}
    assert site_wide <= first
    assert not site_wide & second
    assert not any(name.startswith(("gpufleet_ingest_", "gpufleet_broker_", "gpufleet_alert_")) for name in second)


@pytest.mark.parametrize("nodes", [1, 6])
def test_a_shard_is_read_in_two_queries_whatever_the_fleet_s_size(nodes, make_fleet, django_assert_num_queries):
    make_fleet(nodes, gpus=3)
    with django_assert_num_queries(3):  # two for the fleet, one for the alert channels
        text = render(Shard(0, 2)).decode()
    wanted = sum(shard_of(f"node-{n:02d}", 2) == 0 for n in range(nodes))
    assert text.count("gpufleet_gpu_utilization_percent{") == wanted * 3


def test_an_empty_shard_is_still_valid_text(make_fleet):
    make_fleet(1, gpus=1)
    other = 1 - shard_of("node-00", 2)
    families = {f.name: f for f in text_string_to_metric_families(render(Shard(other, 2)).decode())}
    assert families["gpufleet_gpu_utilization_percent"].samples == []


def test_the_view_serves_a_shard(viewer_client, make_fleet):
    make_fleet(6, gpus=1)
    response = viewer_client.get("/metrics", {"shard": "1", "of": "3"})
    assert response.status_code == 200
    assert _nodes(_samples(response.content.decode())) == {
        f"node-{n:02d}" for n in range(6) if shard_of(f"node-{n:02d}", 3) == 1}


@pytest.mark.parametrize(("query", "says"), [
    ("shard=0", "both"),
    ("of=4", "both"),
    ("shard=4&of=4", "less than"),
    ("shard=5&of=4", "less than"),
    ("shard=0&of=0", "between 1 and"),
    ("shard=-1&of=4", "whole number"),
    ("shard=a&of=4", "whole number"),
    ("shard=0&of=4.0", "whole number"),
    ("shard=&of=", "whole number"),
    ("shard=0&of=99999999999999999999999", "between 1 and"),
    (f"shard=0&of={MAX_SHARDS + 1}", "between 1 and"),
    ("shard=0&shard=1&of=4", "once"),
])
def test_bad_shard_parameters_answer_400_in_words(viewer_client, query, says):
    response = viewer_client.get(f"/metrics?{query}")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    assert says in response.content.decode()


def test_credentials_are_checked_before_the_parameters():
    assert Client().get("/metrics?shard=9&of=2").status_code == 401


def test_the_recommended_shard_count_grows_with_the_fleet():
    assert shards_for(0) == 1
    assert shards_for(1) == 1
    counts = [shards_for(gpus) for gpus in (10_000, 100_000, 480_000, 2_000_000)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] > counts[2] > 1
    assert all(1 <= n <= MAX_SHARDS for n in counts)


def _scrape_configs() -> list[dict]:
    tokens = MarkdownIt("commonmark").parse(DOC.read_text(encoding="utf-8"))
    blocks = [t.content for t in tokens if t.type == "fence" and t.content.startswith("scrape_configs:")]
    assert blocks, "docs/metrics.md shows no scrape_configs"
    return [job for block in blocks for job in yaml.safe_load(block)["scrape_configs"]]


def test_the_documented_scrape_configs_scrape_each_shard_once():
    """What Prometheus does with the documented job: each static target's labels, then
    relabel_configs (replace, the default action), then __param_* labels as URL parameters."""
    (job,) = _scrape_configs()
    assert job["metrics_path"] == "/metrics"
    scraped = []
    for group in job["static_configs"]:
        for target in group["targets"]:
            labels = {"__address__": target, **group.get("labels", {})}
            for rule in job.get("relabel_configs", []):
                assert rule.get("action", "replace") == "replace"
                value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["source_labels"])
                labels[rule["target_label"]] = value
            params = {name: values[0] for name, values in job.get("params", {}).items()}
            params |= {k.removeprefix("__param_"): v for k, v in labels.items() if k.startswith("__param_")}
            visible = {k: v for k, v in labels.items() if not k.startswith("__")}
            scraped.append((params["shard"], params["of"], tuple(sorted(visible.items()))))
    count = int(scraped[0][1])
    assert sorted(int(shard) for shard, _, _ in scraped) == list(range(count))
    assert {of for _, of, _ in scraped} == {str(count)}
    # Targets that differ only in their URL would share one `up` series: each keeps a label.
    assert len({labels for _, _, labels in scraped}) == count
    for shard, of, _ in scraped:
        assert Shard.parse({"shard": [shard], "of": [of]}) == Shard(int(shard), count)


def test_shard_parse_reads_nothing_as_the_whole_fleet():
    assert Shard.parse({}) is None
    assert Shard.parse({"shard": ["2"], "of": ["3"]}) == Shard(2, 3)
    assert re.search("shard", str(pytest.raises(ValueError, Shard.parse, {"of": ["3"]}).value))
