"""The Usage page in the browser, on a small fleet whose figures come through the real
ingest and the beat's roll: grouped by owner, regrouped by image through the form
(HTMX swaps the report in), sorted by a click, followed to the nodes behind an image,
with no Content-Security-Policy complaint. Takes the screenshots docs/usage.md shows."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshots
from gpufleet.usage import period, rollup
from tests.browser.conftest import log_in
from tests.browser.test_journeys import SCREENSHOTS
from tests.claims.helpers import save_owned
from tests.factories import snapshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

H100, A100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S"
# name: (model, GPUs, VRAM MiB, watts busy, watts idle; None: no power reading)
NODES = {
    "h100-a01": (H100, 8, 81559, 610.0, 72.0),
    "h100-a02": (H100, 8, 81559, 540.0, 70.0),
    "a100-b01": (A100, 4, 81920, 330.0, 55.0),
    "l40s-c01": (L40S, 4, 46068, None, None),
}
PYTORCH, VLLM, JUPYTER = "nvcr.io/nvidia/pytorch:24.10-py3", "vllm/vllm-openai:0.6.3", "jupyter/pytorch-notebook"
EVAL, CUDA, PYTHON = "ghcr.io/acme/eval:3.2", "nvcr.io/nvidia/cuda:12.6.2-runtime", "python:3.12"
# Who works where, from the second snapshot on: node -> [(GPUs, image, label, utilization, idle container)].
WORK = {
    "h100-a01": [((0, 1, 2, 3, 4, 5), PYTORCH, "llm-pretrain", 96, False)],
    "h100-a02": [((0, 1), VLLM, "vllm-serve", 58, False), ((2, 3, 4), JUPYTER, None, 0, True)],
    "a100-b01": [((0,), EVAL, "eval-sweep", 71, False), ((2, 3), PYTHON, None, 88, False)],
    "l40s-c01": [((0, 1, 2, 3), CUDA, "render", 44, False)],
}
# (node, claim, owner, GPUs pinned; () for a count of `count`)
CLAIMS = [
    ("h100-a01", "llm-pretrain", "ada", ("0", "1", "2", "3", "4", "5"), 0),
    ("h100-a01", "llm-finetune", "sam", ("6", "7"), 0),
    ("h100-a02", "vllm-serve", "mila", ("0", "1"), 0),
    ("h100-a02", "notebooks", "mila", ("2", "3", "4"), 0),
    ("a100-b01", "eval-sweep", "sam", (), 2),
    ("l40s-c01", "render", "otto", (), 0),
]
HOURS = 6
STEP = timedelta(minutes=10)
# The node heard nothing in its third hour: its snapshots from 02:10 to 03:00 are lost, and
# the one of 03:10 covers only the ten minutes before it (hours from the first snapshot).
SILENT = ("l40s-c01", timedelta(hours=2, minutes=10), timedelta(hours=3, minutes=10))


def _box(name: str, image: str, label: str | None) -> dict:
    return {"id": f"{abs(hash(name)):x}".ljust(64, "0")[:64], "name": name, "image": image, "claim": label}


def _snapshot(name: str, at: datetime, working: bool) -> dict:
    model, count, vram, busy_w, idle_w = NODES[name]
    snap = snapshot(name, count, at=at, util="0", name=model, total_mib=vram, used_mib=512)
    for device in snap["devices"]:
        device["power_draw_w"] = idle_w
    for gpus, image, label, util, idle in WORK[name] if working else []:
        box = _box(f"{name}-{label or image}", image, label)
        for index in gpus:
            device = snap["devices"][index]
            if idle:
                device["attached_idle"] = [box]
                continue
            device["utilization_percent"] = util
            device["vram_used_mib"] = int(vram * 0.8)
            device["power_draw_w"] = busy_w * (0.5 + util / 200) if busy_w else None
            device["processes"] = [{"pid": 4000 + index, "name": "python3", "used_mib": int(vram * 0.8), "container": box}]
    return snap


def demo_fleet(users: dict, end: datetime) -> datetime:
    """HOURS of the fleet above up to `end` (a whole hour), a snapshot of each node every
    ten minutes, the claims made after the first; the finished hours rolled. Returns
    the first snapshot's time."""
    first = end - timedelta(hours=HOURS)
    steps = int(timedelta(hours=HOURS) / STEP)
    for step in range(steps + 1):
        at = first + step * STEP
        silent, since, until = SILENT
        snaps = [_snapshot(name, at, working=step > 0) for name in NODES
                 if not (name == silent and first + since <= at < first + until)]
        # Received as they were sent, so each node was first seen at its first snapshot.
        assert {result.outcome for result in ingest_snapshots(snaps, now=at + timedelta(seconds=2))} == {"accepted"}
        if step == 0:
            # Made then: a claim holds its GPUs from when it starts.
            with time_machine.travel(at + timedelta(seconds=3), tick=False):
                for node, name, owner, pinned, count in CLAIMS:
                    save_owned(Node.objects.get(name=node), gpu.Claim(name=name, count=count, device_ids=pinned),
                               users[owner])
    while rollup.roll(end + rollup.GRACE):
        pass
    return first


def test_the_usage_page_by_owner_then_by_image(page, viewer, django_user_model, artifacts, settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 600
    settings.GPUFLEET_PRICE_GPU_HOUR = {H100: 4.10, A100: 2.20, "*": 1.00}
    settings.GPUFLEET_PRICE_KWH = 0.25
    settings.GPUFLEET_CURRENCY = "EUR"
    users = {name: django_user_model.objects.create_user(username=name) for name in ("ada", "sam", "mila", "otto")}
    now = datetime.now(UTC)
    first = demo_fleet(users, now.replace(minute=0, second=0, microsecond=0))
    # This month, unless it began inside the fleet's hours: then the days they cover.
    month = period.current("month", now)
    url = "/usage/" if month.start <= first else f"/usage/?from={first:%Y-%m-%d}&to={now:%Y-%m-%d}"
    complaints = []
    page.on("console", lambda message: complaints.append(message.text) if message.type == "error" else None)
    log_in(page, viewer)

    page.goto(url)
    rows = page.locator("#usage-report tbody tr")
    expect(rows.first.locator("th")).to_contain_text("ada")
    expect(rows).to_have_count(5)  # ada, sam, mila, otto, and no owner (the unclaimed python job)
    expect(page.locator("#usage-report thead")).to_contain_text("Cost (EUR)")
    expect(page.locator(".usage-chart .usage-bar")).to_have_count(5)
    total = page.locator("#usage-report tfoot tr")
    expect(total).to_contain_text("GPU-h unread")  # the L40S report no power draw
    # ... and were silent from 02:00 to 03:00, which holds the ten minutes the 02:00 snapshot
    # covered (time counts in the bucket of the snapshot that ends it): 4 GPUs × 50 min unknown.
    expect(total.locator("td").last).to_have_text("3.3")
    page.screenshot(path=artifacts / "usage-by-owner.png", full_page=True)

    page.select_option("#id_by", "image")  # HTMX swaps the report in and keeps the URL
    expect(page.locator("#usage-report thead th").first).to_have_text("Image")
    assert "by=image" in page.url
    expect(rows.first.locator("th")).to_contain_text(PYTORCH)
    page.screenshot(path=artifacts / "usage-by-image.png", full_page=True)

    page.get_by_role("link", name="Idle reserved").click()  # largest first
    expect(rows.first.locator("th")).to_contain_text(JUPYTER)
    assert "sort=-idle_reserved" in page.url

    page.get_by_role("link", name=PYTHON).click()  # the nodes behind an image
    expect(page.locator("#usage-report thead th").first).to_have_text("Node")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("th a")).to_have_text("a100-b01")
    assert not [text for text in complaints if "Content Security Policy" in text], complaints

    for name in ("usage-by-owner.png", "usage-by-image.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
        if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
            shutil.copyfile(artifacts / name, SCREENSHOTS / name)
