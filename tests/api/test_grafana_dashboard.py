"""The Grafana dashboard (gpufleet/api/grafana/gpufleet-dashboard.json) queries only
what /metrics serves: every metric name in every panel's expression and in the node
variable, and every label its selectors, groupings and legends name, is one a scrape
of a real fleet returns, so renaming a metric or a label breaks this test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api import metrics
from gpufleet.fleet.models import Device
from gpufleet.ingest.metrics import record_batch, record_snapshot
from tests.factories import ingest

DASHBOARD = Path(__file__).resolve().parents[2] / "gpufleet" / "api" / "grafana" / "gpufleet-dashboard.json"
# PromQL's own words: what is left of an expression once these go is metric names.
PROMQL = {
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "quantile", "stddev", "group", "rate", "irate",
    "increase", "delta", "deriv", "histogram_quantile", "time", "vector", "scalar", "abs", "clamp_min", "clamp_max",
    "max_over_time", "min_over_time", "avg_over_time", "label_replace", "by", "without", "on", "ignoring",
    "group_left", "group_right", "and", "or", "unless", "bool", "offset",
}
# What the dashboard must keep showing (the fleet-scale issue's list).
SHOWN = {
    "gpufleet_gpu_utilization_percent", "gpufleet_gpu_memory_used_bytes", "gpufleet_gpu_memory_total_bytes",
    "gpufleet_gpu_temperature_celsius", "gpufleet_gpu_power_draw_watts", "gpufleet_gpu_ecc_errors_uncorrected",
    "gpufleet_gpu_xid_errors", "gpufleet_node_health", "gpufleet_node_online",
    "gpufleet_node_last_seen_timestamp_seconds", "gpufleet_ingest_snapshots_total",
    "gpufleet_ingest_batch_seconds_bucket", "gpufleet_ingest_batch_size_bucket", "gpufleet_broker_queue_depth",
}
_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"


def parse(expr: str) -> tuple[set[str], set[str]]:
    """The metric names an expression reads, and the label names it mentions (in
    selectors and in by/without/on/ignoring groupings)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: $node, regexes
    text = re.sub(r"\[[^\]]*\]", "", text)  # range durations
    labels = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", text):
        labels |= {name.strip() for name in group.split(",") if name.strip()}
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels |= set(re.findall(rf"({_IDENT})\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", " ", text)
    return {word for word in re.findall(_IDENT, text) if word not in PROMQL}, labels


def test_the_parser_finds_names_and_labels():
    assert parse('sum by (node) (rate(foo_total{a="b",c=~"$x"}[$__rate_interval])) / on (node) bar') == (
        {"foo_total", "bar"}, {"node", "a", "c"})
    assert parse("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))") == ({"x_bucket"}, {"le"})


def _panels(items: list[dict]):
    for panel in items:
        yield panel
        yield from _panels(panel.get("panels", []))


@pytest.fixture
def served(viewer_client, settings, monkeypatch) -> dict[str, set[str]]:
    """Each sample name a scrape of a small fleet returns, with its label names: a node
    with an ECC error and an Xid, every ingest outcome counted, the broker answering."""
    ingest("alpha", 2)
    device = Device.objects.get(node__name="alpha", index=0)
    device.health = {**device.health, "ecc_corrected_volatile": 1, "ecc_uncorrected_volatile": 1,
                     "xid_errors": [{"xid": 79, "count": 1, "last_seen": None, "description": "fell off the bus"}]}
    # The factory's nvidia-smi reports no temperature or power; a real one does.
    device.temperature_c, device.power_draw_w, device.power_limit_w = 61, 420.0, 700.0
    device.save()
    for outcome in ("accepted", "stale", "rejected"):
        record_snapshot(outcome)
    record_batch(3, 0.01)
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/0"
    # The broker, at the network boundary: 3 entries waiting, none trimmed.
    monkeypatch.setattr(metrics.broker, "stream_status", lambda client, stream=None: (3, 0))
    response = viewer_client.get("/metrics")
    assert response.status_code == 200
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_every_panel_queries_metrics_and_labels_that_metrics_serves(served):
    dashboard = json.loads(DASHBOARD.read_text())
    used: set[str] = set()
    targets = 0
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            targets += 1
            where = f"panel {panel['title']!r} {target['refId']}: {target['expr']}"
            names, labels = parse(target["expr"])
            assert names, f"{where} reads no metric"
            unknown = names - set(served)
            assert not unknown, f"{where} uses {sorted(unknown)}, which /metrics does not serve"
            known_labels = set().union(*(served[name] for name in names))
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            assert labels | legend <= known_labels, f"{where} names labels {sorted((labels | legend) - known_labels)}"
            used |= names
    assert targets >= 15
    missing = SHOWN - used
    assert not missing, f"the dashboard no longer shows {sorted(missing)}"


def test_the_datasource_is_a_variable_and_the_node_variable_reads_a_served_metric(served):
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in _panels(dashboard["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"]), panel["title"]
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variables["node"]["query"]["query"]).groups()
    assert label in served[metric]


def test_every_per_gpu_family_is_drawn_by_a_panel(served):
    """Per-GPU series are most of a large fleet's scrape: one that no panel draws should
    not be served per GPU (aggregate it per node or fleet-wide, or drop it)."""
    dashboard = json.loads(DASHBOARD.read_text())
    drawn = set().union(*(parse(target["expr"])[0] for panel in _panels(dashboard["panels"])
                          for target in panel.get("targets", [])))
    per_gpu = {name for name, labels in served.items() if "gpu" in labels}
    assert per_gpu == {name for name, _ in metrics._GPU_FAMILIES}
    assert not per_gpu - drawn, f"served per GPU but drawn by no panel: {sorted(per_gpu - drawn)}"
