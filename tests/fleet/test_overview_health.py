"""The overview's health: each node's worst problem in words, lost GPUs, the
failing and warning nodes in the fleet findings, and search by GPU model."""

from __future__ import annotations

import pytest
from django.urls import reverse

from gpufleet.ingest.services import ingest_snapshot
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db


def _hot_node(name: str = "gpu-07") -> None:
    snap = snapshot(name, 2)
    snap["findings"].append(
        {"code": "gpu1.thermal", "name": "GPU 1", "status": "fail", "message": "Hardware slowdown active at 92 °C"}
    )
    assert ingest_snapshot(snap).outcome == "accepted"


def test_the_table_names_each_node_s_worst_problem_and_lost_gpus(viewer_client):
    _hot_node()
    first = snapshot("gpu-09", 3)
    ingest_snapshot(first)
    ingest_snapshot(snapshot("gpu-09", 2, at=later(first)))
    html = viewer_client.get(reverse("fleet:overview")).content.decode()
    assert "GPU 1: Hardware slowdown active at 92 °C" in html
    assert "1 GPU lost" in html and "1 lost" in html  # the row, and the GPUs tile


def test_the_fleet_findings_list_every_failing_node_with_its_problem(viewer_client):
    _hot_node("gpu-07")
    ingest_snapshot(snapshot("gpu-01", 2))
    html = viewer_client.get(reverse("fleet:overview")).content.decode()
    assert "1 node failing" in html
    assert "gpu-07: GPU 1: Hardware slowdown active at 92 °C" in html


def test_the_name_search_matches_gpu_models_too(viewer_client):
    ingest_snapshot(snapshot("alpha", 2, name="NVIDIA A100-SXM4-80GB"))
    ingest_snapshot(snapshot("beta", 2))  # H200
    html = viewer_client.get(reverse("fleet:overview"), {"q": "a100"}).content.decode()
    assert ">alpha</a>" in html and ">beta</a>" not in html
