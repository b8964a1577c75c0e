"""A node's links and its DCGM diagnostic in the browser, as docs/agent.md shows them: the
8x A100 host of the recordings (tests/fakes/data/health/smi-8x-a100-r535.csv, its GPU 3
busy on a PCIe link trained at Gen3 of Gen4), diagnosed by the agent's own code, whose
last `dcgmi diag -r 1` failed (the recorded H200 run, through the jobs' own services). Its
GPUs' 93 % of VRAM in use would warn on every one; the picture is of a site warning at 95 %."""

from __future__ import annotations

import os
import shutil

import pytest
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.fleet.models import Node
from gpufleet.gpu.dcgm import DcgmInfo
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import JobStatus
from gpufleet.wire import build_snapshot
from tests.browser.conftest import log_in
from tests.browser.test_journeys import SCREENSHOTS
from tests.fakes.memory import CTK, FakeDocker, ok
from tests.fakes.recorded import recording
from tests.gpu.test_links import DOCKER, a100_host

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODE = "a100-n12"
PICTURE = "node-downtrained-and-failed-diagnostic.png"


def test_a_node_with_a_downtrained_link_and_a_failed_diagnostic(page, admin_user, artifacts, sent_tasks):
    runner = a100_host()
    runner.results[CTK] = ok(CTK, "NVIDIA Container Toolkit CLI version 1.18.2\ncommit: 9e88ed3\n")
    diagnosis = gpu.diagnose_host(runner, FakeDocker(DOCKER), [], 95, query=gpu.SmiQuery())
    snap = build_snapshot(diagnosis, NODE, [], dcgm=DcgmInfo(True, "3.1.8"))
    assert ingest_snapshot(snap).outcome == "accepted"
    node = Node.objects.get(name=NODE)
    job = jobs.request_dcgm_diag(node, 1, admin_user)
    assert sent_tasks[-1]["args"] == [job.pk, 1]
    jobs.report_progress(job.pk, JobStatus.RUNNING, node=NODE)
    jobs.report_progress(job.pk, JobStatus.DONE, recording("dcgmi/diag-r1-fail-3.1.8-h200.txt"), node=NODE)

    log_in(page, admin_user)
    page.goto(f"/nodes/{NODE}/")
    section = page.locator("#findings")
    findings = section.locator(".findings").first
    # What needs doing, worst first: the failed diagnostic, then the link; nothing else.
    expect(findings.locator("> li")).to_have_count(2)
    downtrained = findings.locator("tr, li").filter(has_text="PCIe link downtrained while busy")
    expect(downtrained).to_have_count(1)
    expect(downtrained).to_contain_text("GPU 3 (NVIDIA A100-SXM4-40GB, PCI 00000000:0D:00.0)")
    expect(downtrained).to_contain_text("it runs at Gen3 x16, it should run at Gen4 x16")
    expect(findings).to_contain_text("DCGM diagnostic -r 1")
    card = page.locator("#dcgm")
    expect(card).to_contain_text("Failed")
    expect(card).to_contain_text("Persistence mode for GPU 0 is currently disabled.")
    expect(page.locator("#devices tbody tr")).to_have_count(8)
    # A template comment over two lines once showed on the page as text.
    expect(page.locator("body")).not_to_contain_text("fires claims-changed")
    section.screenshot(path=artifacts / PICTURE)

    assert (artifacts / PICTURE).stat().st_size > 10_000
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(artifacts / PICTURE, SCREENSHOTS / PICTURE)
