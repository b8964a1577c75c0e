"""What people do with the dashboard, in headless Chromium against the live test
server: log in, filter the fleet, open a node, edit claims, copy a fix, diagnose,
export, and what a viewer may not do. Each journey checks the page and, where
something changes, the database."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
from datetime import timedelta
from pathlib import Path
from unittest.mock import ANY

import pytest
from django.db.models import F
from playwright.sync_api import expect

from gpufleet import gpu, wire
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Finding, Node
from gpufleet.fleet.reports import CSV_COLUMNS, REPORT_SCHEMA_VERSION, md_cell
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import Job, JobStatus
from tests.browser.conftest import (
    BROKEN,
    CDI_SPEC_FILE,
    GONE,
    HEALTHY,
    HOT,
    SPEC,
    add_history,
    failing_gpu_snapshot,
    log_in,
)
from tests.factories import gpu_uuid, smi_rows

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The pictures the README and docs/ show (GPUFLEET_UPDATE_SCREENSHOTS=1 refreshes them).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"
INGEST = "gpufleet.fleet.tasks.ingest"
JOB_PROGRESS = "gpufleet.jobs.tasks.job_progress"


def rows(page):
    return page.locator("#node-table tbody tr")


def row_of(page, name: str):
    return rows(page).filter(has=page.get_by_role("link", name=name, exact=True))


def expect_rows(page, *names: str) -> None:
    expect(rows(page).locator("th a")).to_have_text(list(names))


def tile(page, label: str):
    return page.locator(".tile", has=page.locator(".tile-label", has_text=re.compile(f"^{re.escape(label)}$")))


def ledger(page, field: str):
    return page.locator(f"#ledger-summary [data-field={field}]")


def pin(node: Node, name: str, indexes, user) -> Claim:
    uuids = tuple(gpu_uuid(node.name, i) for i in indexes)
    return claims.save_claim(node, gpu.Claim(name=name, device_ids=uuids), user)


def count_claim(node: Node, name: str, count: int, user) -> Claim:
    return claims.save_claim(node, gpu.Claim(name=name, count=count), user)


# 1 ---------------------------------------------------------------------------


def test_it_logs_in_through_the_form_and_sees_the_fleet(page, fleet, viewer):
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    page.fill("#id_username", "vera")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_contain_text("didn't match")

    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
    expect(page.locator(".whoami")).to_contain_text("vera")

    # Tiles: 4 of 5 online; GPUs, VRAM and claims count online nodes only (8 + 4 + 8 + 8).
    expect(tile(page, "Nodes online").locator(".tile-value")).to_have_text("4 / 5")
    expect(tile(page, "Nodes online").locator(".tile-sub")).to_have_text("Offline 1 not reporting")
    expect(tile(page, "GPUs").locator(".tile-value")).to_have_text("28")
    # Free: not the failing node's 8, which no claim could use.
    expect(tile(page, "GPUs reserved / free").locator(".tile-value")).to_have_text("0 / 20 free")
    expect(tile(page, "Nodes failing").locator(".tile-value")).to_have_text("1")
    expect(tile(page, "Nodes with warnings").locator(".tile-value")).to_have_text("2")
    expect(page.locator(".fleet-findings")).to_contain_text("1 node stopped reporting")

    # One row per node, worst first (ties by name); status as words next to the colour.
    expect_rows(page, GONE, BROKEN, SPEC, HOT, HEALTHY)
    expect(page.locator(".table-bar")).to_contain_text("Nodes 1–5 of 5")
    for name, label, colour in [(HEALTHY, "OK", "green"), (HOT, "Warning", "amber"), (BROKEN, "Failing", "red"),
                                (GONE, "Offline", "grey"), (SPEC, "Warning", "amber")]:
        badge = row_of(page, name).locator(".badge")
        expect(badge).to_have_text(label)
        expect(badge).to_have_class(f"badge badge-{colour}")
    expect(row_of(page, GONE)).to_have_class(re.compile(r"\bis-offline\b"))
    expect(row_of(page, GONE)).to_contain_text("last report: OK")
    expect(row_of(page, HOT).locator("td.num").first).to_have_text("4")


# 2 ---------------------------------------------------------------------------


def test_it_filters_searches_and_sorts_and_the_url_keeps_it(page, fleet, viewer):
    log_in(page, viewer)
    page.goto("/")
    expect_rows(page, GONE, BROKEN, SPEC, HOT, HEALTHY)

    page.select_option("#id_health", "warn")
    expect(page).to_have_url(re.compile(r"\?health=warn&sort=-health$"))
    expect_rows(page, SPEC, HOT)
    expect(page.locator(".table-bar")).to_contain_text("matching the filters")

    page.fill("#id_q", "h200")
    expect(page).to_have_url(re.compile(r"\?q=h200&health=warn&sort=-health$"))
    expect_rows(page, HOT)

    page.reload()
    expect(page.locator("#id_health")).to_have_value("warn")
    expect(page.locator("#id_q")).to_have_value("h200")
    expect_rows(page, HOT)

    page.get_by_role("link", name="Reset").click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect_rows(page, GONE, BROKEN, SPEC, HOT, HEALTHY)

    # Warning, failing or offline; then sort that by GPU count, both ways.
    page.select_option("#id_health", "problems")
    expect(page).to_have_url(re.compile(r"\?health=problems&sort=-health$"))
    expect_rows(page, GONE, BROKEN, SPEC, HOT)
    gpus = page.locator("#node-table th[aria-sort]", has_text="GPUs")
    gpus.get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"\?health=problems&sort=gpus$"))
    expect(page.locator("#node-table th[aria-sort]", has_text="GPUs")).to_have_attribute("aria-sort", "ascending")
    expect_rows(page, HOT, SPEC, BROKEN, GONE)  # 4 GPUs first; ties by name
    page.locator("#node-table th[aria-sort]", has_text="GPUs").get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"\?health=problems&sort=-gpus$"))
    expect(rows(page).last.locator("th a")).to_have_text(HOT)

    page.reload()
    expect(page.locator("#id_health")).to_have_value("problems")
    expect(page.locator("#node-table th[aria-sort]", has_text="GPUs")).to_have_attribute("aria-sort", "descending")
    expect(rows(page)).to_have_count(4)
    expect(rows(page).last.locator("th a")).to_have_text(HOT)


# 3 ---------------------------------------------------------------------------


def test_it_opens_a_node_and_sees_its_gpus_and_findings_worst_first(page, fleet, viewer):
    log_in(page, viewer)
    page.goto("/")
    row_of(page, BROKEN).get_by_role("link", name=BROKEN).click()
    expect(page).to_have_url(re.compile(rf"/nodes/{BROKEN}/$"))
    expect(page.get_by_role("heading", level=1)).to_have_text(BROKEN)
    expect(page.locator(".node-head .node-title .badge")).to_have_text("Failing")

    devices = page.locator("#devices tbody tr")
    expect(devices).to_have_count(8)
    expect(devices.locator("td.num")).to_have_text([str(i) for i in range(8)])
    expect(devices.locator("code.uuid")).to_have_text([gpu_uuid(BROKEN, i) for i in range(8)])
    expect(devices.first).to_contain_text("NVIDIA H200")

    findings = page.locator("#findings li.finding")
    stored = list(Finding.objects.filter(node__name=BROKEN).values_list("status", flat=True))
    expect(findings).to_have_count(len(stored))
    shown = [re.search(r"finding-(\w+)", c).group(1) for c in findings.evaluate_all("els => els.map(e => e.className)")]
    rank = {"fail": 0, "warn": 1, "ok": 2}
    assert shown == sorted(shown, key=rank.__getitem__), shown
    assert {"fail", "warn", "ok"} <= set(shown)
    expect(findings.first.locator(".badge")).to_have_text("Failing")
    expect(findings.first).to_contain_text("Docker cannot give containers a GPU")
    expect(findings.last.locator(".badge")).to_have_text("OK")


# 4 ---------------------------------------------------------------------------


def test_it_adds_a_claim_that_fits_and_the_page_updates_in_place(page, fleet, operator):
    log_in(page, operator)
    page.goto(f"/nodes/{HEALTHY}/")
    page.evaluate("window.sameDocument = true")
    expect(ledger(page, "reserved")).to_have_text("0")
    expect(ledger(page, "free")).to_have_text("8")
    expect(page.locator("#claims-panel")).to_contain_text("No claims on this node: all 8 GPUs free.")

    form = page.locator("#claim-form")
    form.get_by_label("Name").fill("train-llm")
    form.get_by_label("These GPUs").check()
    form.locator("label.claims-device", has_text="GPU 0 ·").locator("input").check()
    form.locator("label.claims-device", has_text="GPU 1 ·").locator("input").check()
    form.get_by_role("button", name="Add claim").click()

    panel = page.locator("#claims-panel")
    expect(panel.locator(".claims-notice")).to_have_text("Claim train-llm added: GPU 0, GPU 1.")
    expect(ledger(page, "reserved")).to_have_text("2")
    expect(ledger(page, "free")).to_have_text("6")
    expect(ledger(page, "holders")).to_have_text("train-llm")
    claim = Claim.objects.get(node__name=HEALTHY, name="train-llm")
    row = panel.locator(f"#claim-{claim.pk}")
    expect(row).to_contain_text("train-llm")
    expect(row).to_contain_text("GPU 0, GPU 1")
    expect(panel.locator(".claims-audit li").first).to_contain_text("otto claim.create train-llm: — → train-llm: GPUs")
    # The rest of the node page follows the claim (HX-Trigger: claims-changed).
    expect(page.locator("#devices tbody tr").nth(0).locator("td.col-holder")).to_have_text("train-llm")
    expect(page.locator("#devices tbody tr").nth(2).locator("td.col-holder")).to_have_text("—")
    expect(page.locator(".node-head .facts")).to_contain_text("8 · 2 reserved · 6 free")
    assert page.evaluate("window.sameDocument") is True  # swapped in place, never reloaded

    assert claim.device_ids == [gpu_uuid(HEALTHY, 0), gpu_uuid(HEALTHY, 1)] and claim.created_by == operator
    assert Node.objects.get(name=HEALTHY).gpus_reserved == 2
    entry = AuditEntry.objects.get(action="claim.create", target="train-llm")
    assert (entry.username, entry.node_name, entry.before) == ("otto", HEALTHY, None)
    assert entry.after == {"name": "train-llm", "count": 0, "device_ids": claim.device_ids, "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}


# 5 ---------------------------------------------------------------------------


def test_it_explains_at_the_field_why_a_claim_does_not_fit_and_saves_nothing(page, fleet, operator):
    node = fleet[HEALTHY]
    pin(node, "alice-job", [2], operator)
    audit_before = AuditEntry.objects.count()
    log_in(page, operator)
    page.goto(f"/nodes/{HEALTHY}/")
    form = page.locator("#claim-form")
    form.get_by_label("Name").fill("bob-job")

    # A GPU someone holds: said at the GPU list, while choosing (inline validation).
    form.get_by_label("These GPUs").check()
    gpu2 = form.locator("label.claims-device", has_text="GPU 2 ·")
    expect(gpu2).to_contain_text("held by alice-job")
    gpu2.locator("input").check()
    devices_error = page.locator("#id_devices_error")
    expect(devices_error).to_contain_text("GPU 2")
    expect(devices_error).to_contain_text("is already reserved by alice-job")
    # The refused save re-renders the panel: wait until it has replaced this form (the old one already
    # shows the same error), so the next steps act on the new form, not on one about to be swapped out.
    form.evaluate("el => el.setAttribute('data-submitted', '')")
    with page.expect_response(lambda r: r.url.endswith(f"/claims/nodes/{HEALTHY}/new/") and r.request.method == "POST") as saved:
        form.get_by_role("button", name="Add claim").click()
    assert saved.value.ok
    expect(page.locator("#claim-form[data-submitted]")).to_have_count(0)
    expect(page.locator("#id_devices_error")).to_contain_text("is already reserved by alice-job")

    # More GPUs than are free: said at the count.
    form = page.locator("#claim-form")
    form.get_by_label("A number of GPUs").check()
    form.get_by_label("How many GPUs").press_sequentially("9")  # typing: keyup triggers the check
    count_error = page.locator("#id_count_error")
    expect(count_error).to_have_text("Needs 9 GPUs but only 7 of 8 are free.")
    expect(page.locator("#id_devices_error")).to_be_empty()
    form.evaluate("el => el.setAttribute('data-submitted', '')")
    with page.expect_response(lambda r: r.url.endswith(f"/claims/nodes/{HEALTHY}/new/") and r.request.method == "POST") as saved:
        form.get_by_role("button", name="Add claim").click()
    assert saved.value.ok
    expect(page.locator("#claim-form[data-submitted]")).to_have_count(0)
    expect(page.locator("#id_count_error")).to_have_text("Needs 9 GPUs but only 7 of 8 are free.")
    expect(page.locator("#claim-form").get_by_label("Name")).to_have_value("bob-job")  # what was typed stays
    expect(ledger(page, "reserved")).to_have_text("1")

    assert list(Claim.objects.values_list("name", flat=True)) == ["alice-job"]
    assert AuditEntry.objects.count() == audit_before
    assert Node.objects.get(name=HEALTHY).gpus_reserved == 1


# 6 ---------------------------------------------------------------------------


def test_it_edits_a_claim_then_deletes_it_after_confirming(page, fleet, operator):
    claim = count_claim(fleet[HEALTHY], "train-llm", 3, operator)
    log_in(page, operator)
    page.goto(f"/nodes/{HEALTHY}/")
    panel = page.locator("#claims-panel")
    expect(ledger(page, "reserved")).to_have_text("3")

    panel.locator(f"#claim-{claim.pk}").get_by_role("link", name="Edit").click()
    form = page.locator("#claim-form")
    expect(form.get_by_role("heading")).to_have_text("Edit claim train-llm")
    expect(form).to_contain_text("Currently saved: 3 GPUs.")
    expect(form.get_by_label("How many GPUs")).to_have_value("3")
    form.get_by_label("How many GPUs").fill("5")
    form.get_by_role("button", name="Save claim").click()
    expect(panel.locator(".claims-notice")).to_have_text("Claim train-llm saved: 5 GPUs.")
    expect(ledger(page, "reserved")).to_have_text("5")
    expect(panel.locator(f"#claim-{claim.pk}")).to_contain_text("5 GPUs")
    expect(panel.locator(".claims-audit li").first).to_contain_text(
        "otto claim.update train-llm: train-llm: 3 GPUs → train-llm: 5 GPUs")
    claim.refresh_from_db()
    assert claim.count == 5
    update = AuditEntry.objects.get(action="claim.update")
    assert update.before == {"name": "train-llm", "count": 3, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}
    assert update.after == {"name": "train-llm", "count": 5, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}

    # Dismissing the confirmation deletes nothing.
    dialogs = []
    page.once("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    panel.locator(f"#claim-{claim.pk}").get_by_role("link", name="Delete").click()
    expect(panel.locator(f"#claim-{claim.pk}")).to_be_visible()
    assert dialogs == [f"Delete claim train-llm on {HEALTHY}?"]
    assert Claim.objects.filter(pk=claim.pk).exists()

    page.once("dialog", lambda d: d.accept())
    panel.locator(f"#claim-{claim.pk}").get_by_role("link", name="Delete").click()
    expect(panel.locator(".claims-notice")).to_have_text("Claim train-llm deleted.")
    expect(panel).to_contain_text("No claims on this node: all 8 GPUs free.")
    expect(ledger(page, "reserved")).to_have_text("0")
    expect(panel.locator(".claims-audit li").first).to_contain_text(
        "otto claim.delete train-llm: train-llm: 5 GPUs → deleted")
    assert not Claim.objects.filter(pk=claim.pk).exists()
    deleted = AuditEntry.objects.get(action="claim.delete")
    assert (deleted.before, deleted.after) == ({"name": "train-llm", "count": 5, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}, None)
    assert Node.objects.get(name=HEALTHY).gpus_reserved == 0


# 7 ---------------------------------------------------------------------------


def test_it_copies_a_fix_to_the_clipboard(page, fleet, viewer, live_server):
    # Headless Chromium grants the clipboard to the live server's origin, so this
    # reads back what the button really wrote (not only its "Copied" label).
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    log_in(page, viewer)
    page.goto(f"/nodes/{BROKEN}/")
    fix = Finding.objects.get(node__name=BROKEN, code="toolkit")
    assert fix.status == "warn" and fix.fix == gpu.INSTALL_COMMAND
    finding = page.locator("#findings li.finding", has=page.locator("code", has_text=re.compile("^toolkit$")))
    expect(finding).to_contain_text("NVIDIA Container Toolkit not found")
    expect(finding.locator("code.fix-cmd")).to_have_text(fix.fix)

    # By its target, not its label: the label changes to "Copied" and back.
    button = finding.locator("button.copy[data-copy='fix-toolkit']")
    expect(button).to_have_text("Copy")
    button.click()
    expect(button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == fix.fix
    expect(button).to_have_text("Copy")  # the label comes back

    # Advice is not a command: it reads as a sentence, with nothing to copy.
    page.goto(f"/nodes/{SPEC}/")
    advice = page.locator("#findings li.finding", has=page.locator("code", has_text=re.compile("^cdi$")))
    expect(advice).to_contain_text(f"CDI spec {CDI_SPEC_FILE} exists but Docker lists no CDI devices")
    expect(advice.locator(".fix-advice")).to_have_text(gpu.CDI_ENABLE_HINT)
    expect(advice.locator("code.fix-cmd")).to_have_count(0)
    expect(advice.locator("button.copy")).to_have_count(0)


def test_it_applies_an_allowed_fix_only_after_confirming(page, fleet, admin_user, broker_here):
    log_in(page, admin_user)
    page.goto(f"/nodes/{SPEC}/")
    # Only "cdi" is in the node's fixes_allowed: one Apply button, at that finding.
    apply = page.locator("#findings").get_by_role("link", name="Apply fix…")
    expect(apply).to_have_count(1)
    expect(page.locator("#findings li.finding").filter(has=page.get_by_role("link", name="Apply fix…"))).to_contain_text(
        "CDI spec")

    page.once("dialog", lambda d: d.dismiss())
    apply.click()
    expect(page.locator("#findings")).to_be_visible()
    assert not Job.objects.exists() and broker_here.empty()

    page.once("dialog", lambda d: d.accept())
    apply.click()
    job_box = page.locator("#job-slot .job")
    expect(job_box).to_contain_text("Apply fix “cdi” on a40-c01")
    expect(job_box).to_contain_text(f"Waiting for the agent on {SPEC} to pick it up…")
    job = Job.objects.get()
    assert (job.kind, job.fix_code, job.status, job.requested_by) == ("fix", "cdi", JobStatus.QUEUED, admin_user)
    assert broker_here.take(wire.APPLY_FIX_TASK)[1:] == ([job.pk, "cdi"], f"node.{SPEC}")
    assert AuditEntry.objects.filter(action="node.fix", target="cdi", username="ada").exists()


# 8 ---------------------------------------------------------------------------


def test_it_diagnoses_now_and_the_new_findings_come_in(page, fleet, operator, broker_here, fake_host, settings):
    # No worker processes: the in-process broker hands each message to the real task
    # (agent collect on the fake host, job progress, ingest) when the test says so,
    # so every state of the job can be seen on the page. Real workers over Redis are
    # covered by tests/integration.
    # The agent of HEALTHY: the fake host's nvidia-smi now reports nearly full GPUs.
    settings.GPUFLEET_NODE_NAME = HEALTHY
    settings.GPUFLEET_AGENT_KEY = str(credentials.enroll(HEALTHY))  # as `manage.py enroll` gives it
    fake_host.smi_text(smi_rows(HEALTHY, 8, used_mib=140000, util="99"))
    full = "136.7 of 140.4 GiB in use (97%), at or above the 90% warning level"
    # The report the page loads with is a minute old, so the new one's time differs.
    Node.objects.filter(name=HEALTHY).update(collected_at=F("collected_at") - timedelta(minutes=1))
    log_in(page, operator)
    page.goto(f"/nodes/{HEALTHY}/")
    findings = page.locator("#findings")
    expect(findings).to_contain_text("29.3 of 140.4 GiB in use (21%)")
    expect(findings).not_to_contain_text(full)
    head, gpus = page.locator("header.node-head"), page.locator("#devices")
    expect(head).to_contain_text("234.4 / 1123.2 GiB")
    expect(gpus.locator("tbody tr").first).to_contain_text("29.3 / 140.4 GiB")
    collected = head.locator("time").last.get_attribute("datetime")

    page.get_by_role("button", name="Diagnose now").click()
    job_box = page.locator("#job-slot .job")
    expect(job_box).to_contain_text(f"Waiting for the agent on {HEALTHY} to pick it up…")
    job = Job.objects.get()
    assert (job.status, job.requested_by, job.kind) == (JobStatus.QUEUED, operator, "diagnose")
    assert AuditEntry.objects.filter(action="node.diagnose", username="otto", node_name=HEALTHY).exists()

    # The agent picks it up: the real collect task, on the fake host.
    _, args, queue = broker_here.deliver(wire.COLLECT_TASK)
    assert (args, queue) == ([job.pk], f"node.{HEALTHY}")
    broker_here.deliver(JOB_PROGRESS)
    expect(job_box).to_contain_text(f"The agent on {HEALTHY} is working on it…")
    expect(job_box.locator(".badge")).to_have_text("Running")
    expect(findings).not_to_contain_text(full)

    broker_here.deliver(INGEST)
    expect(job_box).to_contain_text("New report stored; the findings are up to date.")
    expect(job_box.locator(".badge")).to_have_text("Done")
    expect(page.locator("#findings li.finding-warn").first).to_contain_text(full)
    expect(page.locator("#findings li.finding-warn")).to_have_count(8)
    expect(findings).not_to_contain_text("29.3 of 140.4 GiB")
    # The header and the GPU table show the new report too, not the one the page loaded with.
    expect(head).to_contain_text("1093.8 / 1123.2 GiB")
    expect(head.locator("time").last).not_to_have_attribute("datetime", collected)
    expect(gpus.locator("tbody tr").first).to_contain_text("136.7 / 140.4 GiB")
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and job.started_at is not None and job.finished_at >= job.started_at
    assert Node.objects.get(name=HEALTHY).health == "warn"
    assert broker_here.empty()


def test_it_says_no_answer_when_the_node_never_answers(page, fleet, operator, broker_here, settings):
    log_in(page, operator)
    page.goto(f"/nodes/{GONE}/")
    page.get_by_role("button", name="Diagnose now").click()
    job_box = page.locator("#job-slot .job")
    expect(job_box).to_contain_text(f"Waiting for the agent on {GONE} to pick it up…")
    broker_here.take(wire.COLLECT_TASK)  # sent, but nobody consumes node.h200-b02

    settings.GPUFLEET_JOB_TIMEOUT = 0.01
    assert jobs.expire_jobs() == 1
    expect(job_box).to_contain_text(f"No answer: {GONE} did not answer in time.")
    expect(job_box.locator(".badge")).to_have_text("No answer")
    job = Job.objects.get()
    assert job.status == JobStatus.EXPIRED and job.error == "the node did not answer in time"
    # Closed jobs stop polling.
    expect(job_box).not_to_have_attribute("hx-trigger", re.compile("every"))


# 9 ---------------------------------------------------------------------------


def download(page, link) -> tuple[str, str]:
    with page.expect_download() as info:
        link.click()
    d = info.value
    return d.suggested_filename, Path(d.path()).read_text()


def test_it_exports_each_format_from_the_node_and_the_fleet_page(page, fleet, viewer):
    log_in(page, viewer)
    page.goto(f"/nodes/{SPEC}/")
    stored = list(Finding.objects.filter(node__name=SPEC).order_by("position"))
    spec_node = Node.objects.get(name=SPEC)
    problems = [f for f in stored if f.status != "ok"]
    assert problems and len(problems) < len(stored)
    links = page.locator(".node-head .downloads")

    name, body = download(page, links.locator("a[href$='/report.json']"))
    assert re.fullmatch(rf"gpufleet-{SPEC}-doctor-\d{{8}}T\d{{6}}Z\.json", name)
    report = json.loads(body)
    assert report["schema_version"] == REPORT_SCHEMA_VERSION and report["node"] == SPEC and report["status"] == "warn"
    assert len(report["devices"]) == 8
    assert [f["code"] for f in report["findings"]] == [f.code for f in stored]
    assert all({"code", "name", "status", "message"} <= f.keys() for f in report["findings"])
    assert next(f for f in report["findings"] if f["code"] == "cdi")["fix"]

    name, body = download(page, links.locator("a[href$='/report.csv']"))
    assert name.endswith(".csv")
    table = list(csv.reader(io.StringIO(body)))
    assert table[0][:6] == ["node", "code", "name", "status", "message", "fix"] and table[0] == list(CSV_COLUMNS)
    findings = [r for r in table[1:] if r[6] == "finding"]
    assert [r[1] for r in findings] == [f.code for f in stored] and {r[0] for r in table[1:]} == {SPEC}
    assert [r[1] for r in table[1:] if r[6] == "device"] == [f"gpu{d.index}" for d in spec_node.current_devices()]

    name, body = download(page, links.locator("a[href$='/report.md']"))
    assert name.endswith(".md")
    assert re.search(rf"^## {re.escape(md_cell(SPEC))}: Warning$", body, re.M) and "| WARN | CDI |" in body

    _, body = download(page, links.locator("a[href$='/report.json?only=problems']"))
    assert [f["code"] for f in json.loads(body)["findings"]] == [f.code for f in problems]
    _, body = download(page, links.locator("a[href$='/report.csv?only=problems']"))
    assert {r[3] for r in list(csv.reader(io.StringIO(body)))[1:]} == {"warn"}
    _, body = download(page, links.locator("a[href$='/report.md?only=problems']"))
    assert "| OK |" not in body and "(warnings and failures only)" in body

    # The fleet's reports hold exactly the nodes the filter shows.
    page.goto("/?health=warn")
    expect_rows(page, SPEC, HOT)
    links = page.locator("#node-table .downloads a")
    _, body = download(page, links.nth(0))
    report = json.loads(body)
    assert report["schema_version"] == REPORT_SCHEMA_VERSION
    assert [n["node"] for n in report["nodes"]] == [SPEC, HOT]
    assert all({"code", "name", "status", "message"} <= f.keys() for n in report["nodes"] for f in n["findings"])
    name, body = download(page, links.nth(1))
    assert re.fullmatch(r"gpufleet-fleet-doctor-\d{8}T\d{6}Z\.csv", name)
    table = list(csv.reader(io.StringIO(body)))
    assert table[0] == list(CSV_COLUMNS) and {r[0] for r in table[1:]} == {SPEC, HOT}
    assert "ok" in {r[3] for r in table[1:]}
    _, body = download(page, links.nth(2))
    assert all(re.search(rf"^## {re.escape(md_cell(node))}: Warning$", body, re.M) for node in (SPEC, HOT))

    _, body = download(page, links.nth(3))
    assert {f["status"] for n in json.loads(body)["nodes"] for f in n["findings"]} == {"warn"}
    _, body = download(page, links.nth(4))
    assert {r[3] for r in list(csv.reader(io.StringIO(body)))[1:]} == {"warn"}
    _, body = download(page, links.nth(5))
    assert "| OK |" not in body and f"## {md_cell(HOT)}: Warning" in body


# 10 --------------------------------------------------------------------------


def test_it_shows_a_viewer_no_controls_and_refuses_their_posts(page, fleet, viewer, operator, broker_here,
                                                                live_server):
    count_claim(fleet[SPEC], "train-llm", 2, operator)
    before = (Claim.objects.count(), Job.objects.count(), AuditEntry.objects.count())
    log_in(page, viewer)
    page.goto(f"/nodes/{SPEC}/")
    expect(page.get_by_role("heading", level=1)).to_have_text(SPEC)
    expect(page.locator("#claims-panel")).to_contain_text("train-llm")

    expect(page.get_by_role("button", name="Diagnose now")).to_have_count(0)
    expect(page.get_by_role("link", name="Apply fix…")).to_have_count(0)
    expect(page.locator("#claim-form")).to_have_count(0)
    expect(page.locator("#claims-panel").get_by_role("link", name="Edit")).to_have_count(0)
    expect(page.locator("#claims-panel").get_by_role("link", name="Delete")).to_have_count(0)
    expect(page.locator("#findings .fix-advice").first).to_contain_text("Upgrade Docker")  # reading is fine

    token = page.locator("input[name=csrfmiddlewaretoken]").first.get_attribute("value")
    assert token
    claim_pk = Claim.objects.get().pk
    posts = {
        f"/claims/nodes/{SPEC}/new/": {"name": "sneaky", "mode": "count", "count": "1"},
        f"/claims/nodes/{SPEC}/validate/": {"name": "sneaky", "mode": "count", "count": "1"},
        f"/claims/{claim_pk}/delete/": {"confirm": "yes"},
        f"/nodes/{SPEC}/diagnose/": {},
        f"/nodes/{SPEC}/fix/cdi/": {},
    }
    for url, form in posts.items():
        response = page.request.post(url, form={**form, "csrfmiddlewaretoken": token},
                                     headers={"X-CSRFToken": token}, max_redirects=0)
        assert response.status == 403, (url, response.status)
        assert "CSRF" not in response.text(), url  # refused for the role, not for the token
    assert (Claim.objects.count(), Job.objects.count(), AuditEntry.objects.count()) == before
    assert Claim.objects.get().name == "train-llm" and broker_here.empty()

    # The same request with an operator's session goes through (so the 403 was the role).
    other = page.context.browser.new_context(base_url=live_server.url)
    try:
        op_page = log_in(other.new_page(), operator)
        op_page.goto(f"/nodes/{SPEC}/")
        op_token = op_page.locator("input[name=csrfmiddlewaretoken]").first.get_attribute("value")
        response = op_page.request.post(f"/claims/nodes/{SPEC}/validate/", headers={"X-CSRFToken": op_token},
                                        form={"name": "ok", "mode": "count", "count": "1"})
        assert response.status == 200
    finally:
        other.close()


# 11 --------------------------------------------------------------------------


def test_it_takes_screenshots_of_the_overview_and_a_node(page, fleet, operator, admin_user, artifacts):
    node = fleet[SPEC]
    add_history(node)
    pin(node, "train-llm", [0, 1, 2, 3], operator)
    count_claim(node, "notebooks", 2, operator)
    count_claim(fleet[HEALTHY], "batch-eval", 4, operator)
    sick = ingest_snapshot(failing_gpu_snapshot("h100-d01"))
    assert sick.outcome == "accepted"
    add_history(Node.objects.get(name="h100-d01"))
    log_in(page, admin_user)  # every control shows

    page.goto("/")
    expect(rows(page)).to_have_count(6)
    # Worst first: the offline node, then the two failing ones by name.
    expect(rows(page).locator("th a")).to_have_text([GONE, "h100-d01", BROKEN, SPEC, HOT, HEALTHY])
    expect(row_of(page, "h100-d01")).to_contain_text("GPU 2")
    page.screenshot(path=artifacts / "overview.png", full_page=True)

    # The GPU table with its charts needs a desktop's width (below it scrolls sideways).
    page.set_viewport_size({"width": 1680, "height": 1050})
    page.goto("/nodes/h100-d01/")
    gpu2 = page.locator("#devices tbody tr").nth(2)
    expect(gpu2).to_contain_text("92")  # °C, at the thermal slowdown
    expect(page.locator(".findings").first).to_contain_text("GPU 2")
    page.screenshot(path=artifacts / "node-failing-gpu.png", full_page=True)

    page.goto(f"/nodes/{SPEC}/")
    expect(page.locator("#devices tbody tr")).to_have_count(8)
    expect(page.locator("#devices svg.spark polyline.spark-vram")).to_have_count(8)
    expect(page.locator("#claims-panel .claims-table tbody tr")).to_have_count(2)
    page.screenshot(path=artifacts / "node.png", full_page=True)

    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/")
    expect(rows(page)).to_have_count(6)
    page.screenshot(path=artifacts / "overview-phone.png", full_page=True)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the phone layout scrolls sideways ({width} px)"

    for name in ("overview.png", "node.png", "node-failing-gpu.png", "overview-phone.png"):
        assert (artifacts / name).stat().st_size > 10_000, name
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(exist_ok=True)
        for name in ("overview.png", "node.png", "node-failing-gpu.png"):
            shutil.copyfile(artifacts / name, SCREENSHOTS / name)
