"""Every page at a phone's, a laptop's and a desktop's width, with a realistic fleet:
no page is wider than the screen, the fleet's node table fits without scrolling
sideways from a laptop up, and on a phone every table row is a stack of cells that
each say what they are (the column headers are hidden there)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet import gpu
from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Delivery
from gpufleet.api.models import ApiToken
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.browser.conftest import BROKEN, HEALTHY, SPEC, add_history, failing_gpu_snapshot, log_in
from tests.browser.test_claims_vs_use import _work
from tests.factories import gpu_uuid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (390, 1280, 1920)
PHONE = 390
BUSY = "h100-e01"

# The cells a phone shows without a header above them, each without a label of its own.
UNLABELLED_CELLS = """() => {
  const found = [];
  for (const td of document.querySelectorAll("table td")) {
    if (td.classList.contains("empty") || !td.offsetParent || !td.innerText.trim()) continue;
    // The node calendar is a grid of hours that scrolls sideways in a box of its own: never stacked.
    if (td.closest("table.calendar-table")) continue;
    const label = td.getAttribute("data-label") || "";
    const before = getComputedStyle(td, "::before");
    const shown = before.display !== "none" && before.content.includes(label);
    if (!label || !shown) {
      const table = td.closest("table");
      found.push(`${table.id || table.className}: ${td.innerText.trim().slice(0, 40)}`);
    }
  }
  return found;
}"""

# Tables that scroll sideways inside their box.
OVERFLOWING_TABLES = """() => Array.from(document.querySelectorAll(".table-scroll"))
  .filter((box) => box.scrollWidth > box.clientWidth + 1)
  .map((box) => `${box.querySelector("table").className} ${box.scrollWidth} > ${box.clientWidth}`)"""


@pytest.fixture
def busy_fleet(fleet, operator, admin_user):
    """The five nodes of `fleet`, a node failing on its GPUs, one with containers
    outside their claims, 24 h of history, claims with owners, contacts and ends,
    a finished job with output, and an API token."""
    add_history(fleet[SPEC])
    sick = ingest_snapshot(failing_gpu_snapshot("h100-d01"))
    assert sick.outcome == "accepted"
    assert ingest_snapshot(_work(datetime.now(UTC))).outcome == "accepted"
    busy = Node.objects.get(name=BUSY)
    claims.save_claim(busy, gpu.Claim(name="train-llm", device_ids=("0", "1")), operator)
    claims.save_claim(busy, gpu.Claim(name="notebooks", device_ids=("5",)), operator)
    claims.save_claim(fleet[SPEC], gpu.Claim(name="train-llm-70b-finetune",
                                             device_ids=tuple(gpu_uuid(SPEC, i) for i in range(4))), operator,
                      terms=claims.Terms(owner=operator, contact="#llm-team on chat, or ml-oncall@example.org",
                                         ends_at=datetime.now(UTC) + timedelta(days=3)))
    claims.save_claim(fleet[HEALTHY], gpu.Claim(name="batch-eval", count=4), operator)
    job = Job.objects.create(node=fleet[BROKEN], kind=JobKind.FIX, fix_code="toolkit", status=JobStatus.DONE,
                             requested_by=admin_user, started_at=datetime.now(UTC), finished_at=datetime.now(UTC),
                             output="Reading package lists... Done\n" + "Setting up nvidia-container-toolkit "
                             "(1.18.2-1) ... /usr/lib/x86_64-linux-gnu/libnvidia-container.so.1.18.2\n" * 20)
    ApiToken.issue(admin_user, "grafana-dashboard-readonly", "read")
    alerts.save_rule(None, {"name": "H100 racks, failing or warning", "kinds": ["finding", "offline", "gpu-vanished"],
                            "min_severity": "warn", "nodes": "rack4-*", "gpu_model": "H100", "repeat_hours": 4},
                     [alerts.save_channel(None, "ml-oncall-email", "mailtos://u:p@smtp.example.com?to=a@example.com"),
                      alerts.save_channel(None, "gpu-ops-webhook", "json://hooks.example.com/gpufleet")])
    alerts.save_silence(None, "rack4-*", datetime.now(UTC), datetime.now(UTC) + timedelta(hours=3),
                        "PDU replacement in rack 4, every node reboots twice")
    return job


def pages(job: Job) -> list[str]:
    return [
        "/",
        f"/nodes/{SPEC}/",
        "/nodes/h100-d01/",
        f"/nodes/{BUSY}/",
        "/claims/",
        f"/claims/nodes/{SPEC}/new/",
        "/claims/find/?count=2&model=&min_free_vram_gib=10",
        "/claims/use/",
        "/usage/?by=claim",
        "/audit/",
        "/tokens/",
        f"/jobs/{job.pk}/",
        "/alerts/channels/",
        "/alerts/rules/",
        "/alerts/silences/",
        "/alerts/deliveries/",
    ]


def _too_wide(page, width: int) -> int | None:
    scroll = page.evaluate("document.documentElement.scrollWidth")
    return scroll if scroll > width else None


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_is_wider_than_the_screen(page, busy_fleet, admin_user, width):
    page.set_viewport_size({"width": width, "height": 900})
    problems = []
    page.goto("/accounts/login/")
    if scroll := _too_wide(page, width):
        problems.append(f"/accounts/login/ is {scroll} px wide")
    log_in(page, admin_user)  # every control shows
    for url in pages(busy_fleet):
        page.goto(url)
        if scroll := _too_wide(page, width):
            problems.append(f"{url} is {scroll} px wide")
        if width == PHONE:
            problems += [f"{url}: unlabelled cell {cell}" for cell in page.evaluate(UNLABELLED_CELLS)]
        elif url == "/":
            problems += [f"{url}: scrolls sideways: {box}" for box in page.evaluate(OVERFLOWING_TABLES)]
    assert not problems, "\n".join(problems)


def test_the_node_table_fits_a_1440_px_screen(page, busy_fleet, admin_user):
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, admin_user)
    page.goto("/")
    assert page.evaluate(OVERFLOWING_TABLES) == []
    for column in ("Driver", "Toolkit", "Reserved", "Free", "Last seen"):
        header = page.locator("#node-table thead th", has_text=column)
        assert header.is_visible(), column
        box = header.bounding_box()
        assert box["x"] + box["width"] <= 1440, column


def test_the_deliveries_message_column_shows_whole_at_1440_px(page, busy_fleet, admin_user):
    title = ("GPU failing: h100-d01 GPU 2 (Xid 79), GPU 5 (uncorrectable ECC errors), GPU 7 (thermal slowdown) "
             "and 4 more findings on rack4-h100-d01 and rack4-h100-d02")
    Delivery.objects.create(rule_name="H100 racks, failing or warning", channel_name="ml-oncall-email",
                            notice="opened", status="failed", tries=3, title=title,
                            error="the mail relay refused the message: 554 5.7.1 relaying denied for this sender "
                                  "address, ask the postmaster to allow it")
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, admin_user)
    page.goto("/alerts/deliveries/")
    assert page.evaluate(OVERFLOWING_TABLES) == []
    message = page.locator("#deliveries-table td[data-label=Message]", has_text="GPU failing")
    box = message.bounding_box()
    assert box["x"] + box["width"] <= 1440
    assert message.evaluate("(cell) => cell.scrollWidth <= cell.clientWidth")


def test_a_phone_shows_a_nodes_findings_before_its_gpus(page, busy_fleet, admin_user):
    page.set_viewport_size({"width": PHONE, "height": 800})
    log_in(page, admin_user)
    page.goto("/nodes/h100-d01/")  # 8 failing GPUs: a long stack of GPU cards on a phone
    findings, gpus = page.locator("#findings").bounding_box(), page.locator("#devices").bounding_box()
    assert findings["y"] < gpus["y"]
    assert page.locator("#node-head").bounding_box()["y"] < findings["y"]
    # From a laptop up, the GPU table stays first: it is short there.
    page.set_viewport_size({"width": 1280, "height": 900})
    assert page.locator("#devices").bounding_box()["y"] < page.locator("#findings").bounding_box()["y"]
