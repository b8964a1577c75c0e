"""The fleet's memory and its alert channels in the browser, as docs/events.md and
docs/alerts.md show them: the Events page with open and closed events of several kinds,
a node page's timeline with durations, and the Channels page with a working channel
and a failing one. Every event comes the way the site makes it (snapshots ingested at
their times, the beat's and people's actions); the channels' states come from real
notifications to the loopback receivers."""

from __future__ import annotations

import os
import re
import shutil
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Channel
from gpufleet.claims import services as claims
from gpufleet.events import services as events
from gpufleet.events.models import Event
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node
from gpufleet.ingest.refusals import count_refusals
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs.models import Job, JobKind, JobStatus
from gpufleet.jobs.services import report_progress
from gpufleet.wire import build_snapshot
from tests.browser.conftest import GONE, HEALTHY, HOT, SPEC, assert_cells_line_up, log_in
from tests.browser.test_journeys import SCREENSHOTS
from tests.fakes.memory import FakeDocker, host
from tests.fakes.recorded import recording

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NODE = "h100-d01"
GPU3_HOT = {"temperature.gpu": "88", "clocks_event_reasons.sw_thermal_slowdown": "Active"}
GPU3_ECC = {"ecc.errors.uncorrected.volatile.total": "2"}
PICTURES = ("events.png", "node-timeline.png", "channels.png")


def h100_snapshot(at: datetime, gpu3: dict[str, str] | None = None, kernel_log: str = "") -> dict:
    """NODE's snapshot at `at`, diagnosed by the agent's own code: the recorded healthy
    8×H100 host with GPU 3's columns changed by `gpu3`, and its kernel log."""
    header, *rows = recording("health/smi-8x-h100.csv").splitlines()
    columns = [column.strip() for column in header.split(",")]
    cells = rows[3].split(", ")
    for column, value in (gpu3 or {}).items():
        cells[columns.index(column)] = value
    rows[3] = ", ".join(cells)
    runner = host(smi="\n".join([header, *rows]) + "\n", dmesg=kernel_log,
                  ctk="NVIDIA Container Toolkit CLI version 1.18.2\ncommit: 9e88ed3\n")
    diagnosis = gpu.diagnose_host(runner, FakeDocker(gpu.DockerInfo(runtimes=("runc", "nvidia"))), [], now=at)
    return build_snapshot(diagnosis, NODE, [], at)


def report(at: datetime, **state) -> None:
    with time_machine.travel(at, tick=False):
        assert ingest_snapshot(h100_snapshot(at, **state), now=at).outcome == "accepted"


def node_history(now: datetime) -> None:
    """Yesterday NODE stopped reporting for a while at night, had its key rotated and
    ran hot on GPU 3 in the afternoon; for the last 50 minutes GPU 3 has uncorrectable
    ECC errors with an Xid 48 in the kernel log."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    at = day.replace(hour=3, minute=0)
    report(at)
    credentials.enroll(NODE)
    with time_machine.travel(at + timedelta(minutes=10), tick=False):
        events.record_offline(Node.objects.filter(name=NODE).values_list("pk", "last_seen"))  # as the beat does
    for minutes in (52, 53):  # back: clear, then closed at 03:52
        report(at + timedelta(minutes=minutes))
    with time_machine.travel(day.replace(hour=10, minute=15), tick=False):
        credentials.enroll(NODE, rotate=True)
    at = day.replace(hour=14, minute=2)
    report(at, gpu3=GPU3_HOT)
    report(at + timedelta(minutes=20), gpu3=GPU3_HOT)
    for minutes in (35, 36):  # cooled down: closed at 14:37
        report(at + timedelta(minutes=minutes))
    xid_at = now - timedelta(minutes=50)
    xid = (f"{xid_at:%Y-%m-%dT%H:%M:%S},000000+00:00 NVRM: Xid (PCI:0000:5d:00): 48, pid=2210, name=vllm, An "
           "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6.\n")
    report(xid_at, gpu3=GPU3_ECC, kernel_log=xid)
    report(now - timedelta(seconds=30), gpu3=GPU3_ECC, kernel_log=xid)


def fleet_doings(fleet, operator, now: datetime) -> None:
    """The rest of the fleet's day: a node offline, refused snapshots, a claim
    released, a fix applied."""
    events.record_offline([(fleet[GONE].pk, fleet[GONE].last_seen)], now - timedelta(minutes=100))
    count_refusals({(HEALTHY, "old-key"): 3})
    claim = claims.save_claim(fleet[HOT], gpu.Claim(name="notebooks", count=2), operator)
    claims.delete_claim(claim, operator, expected_updated_at=claim.updated_at)
    fix = Job.objects.create(node=fleet[SPEC], kind=JobKind.FIX, fix_code="cdi", requested_by=operator)
    report_progress(fix.pk, JobStatus.RUNNING, node=SPEC)
    report_progress(fix.pk, JobStatus.DONE, output="CDI enabled in /etc/docker/daemon.json", node=SPEC)


def test_it_takes_screenshots_of_events_a_timeline_and_the_channels(page, fleet, operator, admin_user, webhook, inbox,
                                                                   settings, artifacts):
    settings.GPUFLEET_COLLECT_INTERVAL = 60
    settings.GPUFLEET_EVENT_CLOSE_AFTER_S = 60
    now = datetime.now(UTC)
    node_history(now)
    fleet_doings(fleet, operator, now)
    kinds = set(Event.objects.values_list("kind", flat=True))
    assert {"finding", "offline", "rejected-snapshot", "claim-released", "fix-applied", "key-rotated"} <= kinds
    assert Event.objects.filter(closed_at__isnull=True).exists() and Event.objects.filter(closed_at__isnull=False)

    # Channels: email works; the webhook answers 503 to every try, so it is failing.
    settings.GPUFLEET_ALERT_GROUP_S = 0
    settings.GPUFLEET_ALERT_RETRY_S = 0.01
    email = alerts.save_channel(admin_user, "ops-email", inbox.url)
    hook = alerts.save_channel(admin_user, "ops-webhook", webhook.url)
    alerts.save_rule(admin_user, {"name": "Failing", "min_severity": "fail", "wait_minutes": 0}, [email, hook])
    webhook.status = 503
    for _ in range(3):
        alerts.run_once()
        Channel.objects.get(pk=hook.pk).deliveries.update(next_try_at=now)  # its retry is due
    assert Channel.objects.get(pk=hook.pk).failing and Channel.objects.get(pk=email.pk).last_sent_at
    assert len(webhook.posts) == 3 and inbox.messages

    log_in(page, admin_user)
    page.goto("/events/")
    table = page.locator("#events-table")
    expect(table.locator("tbody tr").first.locator(".badge-blue")).to_have_text("open")
    expect(table).to_contain_text("Fix applied")
    expect(table).to_contain_text("Rejected snapshots")
    expect(table).to_contain_text("Node offline")
    # Long names and messages wrap: nothing of the table is out of sight on a desktop.
    scroller = table.locator(".table-scroll")
    assert scroller.evaluate("e => e.scrollWidth <= e.clientWidth"), "the events table scrolls sideways at 1280 px"
    page.screenshot(path=artifacts / "events.png", full_page=True)

    page.goto(f"/nodes/{NODE}/")
    timeline = page.locator("#timeline")
    items = timeline.locator("li")
    expect(items).to_have_count(5)  # the Xid and the ECC errors, the heat, the key, the night offline
    hot = items.filter(has_text="Thermal slowdown active at 88 °C")
    expect(hot).to_contain_text(re.compile(r"14:02–14:37,\s+35 minutes"))
    expect(items.filter(has_text="No snapshot since")).to_contain_text(re.compile(r"03:10–03:52,\s+42 minutes"))
    expect(items.filter(has_text="Xid 48")).to_contain_text("open")
    timeline.screenshot(path=artifacts / "node-timeline.png")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Alerts").click()
    rows = page.locator("tbody tr")
    failing = rows.filter(has=page.get_by_role("rowheader", name="ops-webhook"))
    expect(failing.locator(".badge")).to_have_text("failing")
    expect(failing).to_contain_text("503")
    expect(failing).to_contain_text("json://…")
    working = rows.filter(has=page.get_by_role("rowheader", name="ops-email"))
    expect(working.locator(".badge")).to_have_text("working")
    expect(working).to_contain_text("mailto://…")
    working.get_by_role("button", name="Send a test").click()
    expect(working.get_by_role("status")).to_have_text("test sent")
    expect(page.locator("body")).not_to_contain_text("127.0.0.1")
    for row in rows.all():
        assert_cells_line_up(row)
    page.set_viewport_size({"width": 1280, "height": 400})  # the page's own height, not the window's
    page.screenshot(path=artifacts / "channels.png", full_page=True)

    for name in PICTURES:
        assert (artifacts / name).stat().st_size > 10_000, name
    if os.environ.get("GPUFLEET_UPDATE_SCREENSHOTS") == "1":
        for name in PICTURES:
            shutil.copyfile(artifacts / name, SCREENSHOTS / name)
