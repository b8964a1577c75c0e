"""DCGM diagnostics in the browser: a node whose last -r 1 failed shows the failing
finding, the result test by test with DCGM's messages, and its validation; an admin asks
for -r 2 through its confirmation dialog and the job appears without a reload. Takes the
screenshot docs/diagnostics.md shows."""

from __future__ import annotations

import os
import shutil

import pytest
from playwright.sync_api import expect

from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Node
from gpufleet.gpu.dcgm import DcgmInfo
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import Job, JobStatus
from tests.browser.conftest import log_in
from tests.browser.test_journeys import SCREENSHOTS
from tests.factories import snapshot
from tests.fakes.recorded import recording

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODE = "h200-c07"


def test_a_node_with_a_failed_diagnostic(page, admin_user, artifacts, sent_tasks):
    snap = snapshot(NODE, 8)
    snap["dcgm"] = DcgmInfo(True, "3.1.8").to_dict()
    assert ingest_snapshot(snap).outcome == "accepted"
    node = Node.objects.get(name=NODE)
    maintenance.start_validation(node, 1, "after maintenance: GPU 3 reseated", admin_user)
    job = jobs.request_dcgm_diag(node, 1, admin_user)
    jobs.report_progress(job.pk, JobStatus.RUNNING, node=NODE)
    jobs.report_progress(job.pk, JobStatus.DONE, recording("dcgmi/diag-r1-fail-3.1.8-h200.txt"), node=NODE)
    log_in(page, admin_user)

    page.goto(f"/nodes/{NODE}/")
    card = page.locator("#dcgm")
    expect(card).to_contain_text("DCGM 3.1.8")
    expect(card).to_contain_text("In validation")
    expect(card).to_contain_text("Failed")
    expect(card).to_contain_text("Persistence mode for GPU 0 is currently disabled.")
    expect(page.locator(".findings").first).to_contain_text("DCGM diagnostic -r 1")
    expect(page.locator("#timeline")).to_contain_text("DCGM diagnostic -r 1 failed")
    card.screenshot(path=artifacts / "node-dcgm-diagnostic.png")

    page.once("dialog", lambda dialog: dialog.accept())
    card.get_by_role("link", name="Run medium diagnostic (-r 2)…").click()
    expect(page.locator("#job-slot")).to_contain_text("DCGM diagnostic -r 2")
    assert Job.objects.filter(level=2, status="queued").exists() and sent_tasks[-1]["args"][1] == 2

    name = "node-dcgm-diagnostic.png"
    assert (artifacts / name).stat().st_size > 10_000
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(artifacts / name, SCREENSHOTS / name)
