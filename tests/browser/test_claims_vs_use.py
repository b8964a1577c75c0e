"""Who is on each GPU, in the browser: a node page listing the containers and
processes on its GPUs beside the claims that hold them, and the fleet's Claims vs
use page sorted by a click. Takes the screenshots the README and docs/claims.md show."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.browser.conftest import log_in
from tests.browser.test_journeys import SCREENSHOTS
from tests.factories import snapshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODE = "h100-e01"


def _box(name: str, image: str, claim: str | None = None) -> dict:
    return {"id": f"{abs(hash(name)):x}".ljust(64, "0")[:64], "name": name, "image": image, "claim": claim}


def _work(at) -> dict:
    """8 GPUs: a labelled training job on 0-1, an unlabelled one on 2, a host process
    on 3, a notebook attached to 5 that runs nothing; the others quiet."""
    snap = snapshot(NODE, 8, at=at)
    for device in snap["devices"]:
        device["utilization_percent"] = 0
    trainer = _box("llm-trainer", "nvcr.io/nvidia/pytorch:24.10-py3", "train-llm")
    for index in (0, 1):
        snap["devices"][index]["utilization_percent"] = 97
        snap["devices"][index]["processes"] = [
            {"pid": 4412 + index, "name": "python3", "used_mib": 71_680, "container": trainer}]
    snap["devices"][2]["utilization_percent"] = 64
    snap["devices"][2]["processes"] = [
        {"pid": 5120, "name": "python3", "used_mib": 40_960, "container": _box("eval-sweep", "ghcr.io/acme/eval:3.2")}]
    snap["devices"][3]["utilization_percent"] = 21
    snap["devices"][3]["processes"] = [{"pid": 777, "name": "/opt/bench/gpu-burn", "used_mib": 2_048, "container": None}]
    snap["devices"][5]["attached_idle"] = [_box("notebook-ana", "jupyter/pytorch-notebook")]
    return snap


def test_the_node_page_shows_who_is_on_each_gpu_and_claims_vs_use_sorts(page, operator, viewer, artifacts):
    day_ago = datetime.now(UTC) - timedelta(hours=25)
    assert ingest_snapshot(_work(day_ago)).outcome == "accepted"
    node = Node.objects.get(name=NODE)
    with time_machine.travel(day_ago, tick=False):  # a claim is idle from its start
        claims.save_claim(node, gpu.Claim(name="train-llm", device_ids=("0", "1")), operator)
        claims.save_claim(node, gpu.Claim(name="notebooks", device_ids=("5",)), operator)
    assert ingest_snapshot(_work(datetime.now(UTC))).outcome == "accepted"
    other = snapshot("a40-f02", 4)
    other["devices"][1]["processes"] = [{"pid": 9, "name": "python3", "used_mib": 1024,
                                         "container": _box("stray", "python:3.12", "batch")}]
    assert ingest_snapshot(other).outcome == "accepted"
    log_in(page, viewer)

    page.goto(f"/nodes/{NODE}/")
    gpus = page.locator("#devices tbody tr")
    expect(gpus.nth(0)).to_contain_text("llm-trainer")
    expect(gpus.nth(0)).to_contain_text("train-llm")  # held by
    expect(gpus.nth(2)).to_contain_text("eval-sweep")
    expect(gpus.nth(3)).to_contain_text("host")
    expect(gpus.nth(5)).to_contain_text("notebook-ana")
    expect(gpus.nth(5)).to_contain_text("attached, idle")
    findings = page.locator(".findings").first
    expect(findings).to_contain_text("Used but unclaimed")
    expect(findings).to_contain_text("GPU 2 (container eval-sweep)")
    expect(findings).to_contain_text("Claimed but idle")
    expect(findings).to_contain_text("'notebooks' (GPU 5)")
    page.screenshot(path=artifacts / "node-containers.png", full_page=True)

    page.goto("/claims/use/")
    kinds = page.locator("#use-table tbody th")
    expect(kinds).to_have_text(["Running outside its claim", "Used but unclaimed", "Claimed but idle",
                                "Used but unclaimed"])
    page.get_by_role("link", name="Kind").click()  # HTMX swaps the table in, sorted by kind
    expect(kinds).to_have_text(["Claimed but idle", "Running outside its claim", "Used but unclaimed",
                                "Used but unclaimed"])
    assert "sort=kind" in page.url
    page.screenshot(path=artifacts / "claims-vs-use.png", full_page=True)

    for name in ("node-containers.png", "claims-vs-use.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
        if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
            shutil.copyfile(artifacts / name, SCREENSHOTS / name)
