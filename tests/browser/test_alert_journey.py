"""Alerts end to end, in headless Chromium: an admin adds a channel for each real
receiver on loopback (a JSON webhook, an SMTP inbox) and sends each a test, a rule and
a silence for another node, all through the pages' forms. Then two nodes' agents find a
lost GPU (the fake host's nvidia-smi and kernel log) and send their snapshots through
the real Redis broker to the real ingest consumer; the alerts run as the beat runs
them. Only the node not silenced is announced, once per channel, and the pages say so."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect

from gpufleet.agent.tasks import collect
from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Delivery, Status
from gpufleet.core import broker as redis_broker
from gpufleet.events.models import Event
from gpufleet.fleet import credentials
from gpufleet.fleet.models import Node
from gpufleet.ingest import stream
from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

FAILING, SILENCED = "h100-d01", "h100-lab-02"
LOST_PCI = "0000:3A:00.0"
TEST_TITLE = "gpufleet: test notification"


def add_channel(page, name: str, url: str) -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("apprise URL").fill(url)
    page.get_by_role("button", name="Add channel").click()
    expect(page.get_by_text(f"Channel {name} added.")).to_be_visible()


def send_a_test(page, name: str) -> None:
    row = page.locator("tbody tr", has=page.get_by_role("rowheader", name=name, exact=True))
    row.get_by_role("button", name="Send a test").click()
    expect(row.get_by_role("status")).to_have_text("test sent")  # in place, by HTMX


def gpu_falls_off_the_bus(fake_host, node: str, settings) -> None:
    """The node's agent, as its beat runs it: nvidia-smi loses GPU 2 (exit 15) and the
    kernel log has its Xid 79 of a minute ago; the snapshot goes, signed with the
    node's key, to the ingest stream through the stream's append function."""
    settings.GPUFLEET_NODE_NAME = node
    settings.GPUFLEET_AGENT_KEY = str(credentials.enroll(node))  # as `manage.py enroll` prints it
    fake_host.smi("health/smi-3x-h100-gpu-lost.exit15.csv", exit_code=15)
    at = datetime.now(UTC) - timedelta(minutes=1)
    fake_host.kernel_log(f"{at:%Y-%m-%dT%H:%M:%S},000000+00:00 NVRM: Xid (PCI:0000:3a:00): 79, pid=0, "
                         "name=, GPU has fallen off the bus.\n")
    collect.apply(throw=True)


def consume(names: set[str]) -> None:
    """The ingest consumer's own loop step, reading the group on the real stream, until
    the nodes' snapshots are stored."""
    consumer = stream.Consumer(redis_broker.client(), name="journey", block_ms=100)
    for _ in range(50):
        consumer.step()
        if Node.objects.filter(name__in=names).count() == len(names):
            return
    raise AssertionError(f"the snapshots of {sorted(names)} were not stored")


def test_an_admin_sets_up_alerts_and_hears_of_a_failing_node_but_not_a_silenced_one(
        page, admin_user, broker, fake_host, webhook, inbox, settings, live_server, artifacts):
    settings.GPUFLEET_ALERT_GROUP_S = 0  # send at once, not after the grouping window
    settings.GPUFLEET_SITE_URL = live_server.url
    log_in(page, admin_user)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Alerts").click()
    expect(page.get_by_role("heading", name="Alert channels")).to_be_visible()

    # Channels, each tested from its row; the URL is shown as its scheme alone.
    add_channel(page, "ops-webhook", webhook.url)
    add_channel(page, "ops-email", inbox.url)
    table = page.locator("table tbody")
    expect(table.get_by_role("rowheader")).to_have_text(["ops-email", "ops-webhook"])
    expect(table).to_contain_text("json://…")
    expect(table).to_contain_text("mailto://…")
    expect(page.locator("body")).not_to_contain_text("127.0.0.1")
    send_a_test(page, "ops-webhook")
    send_a_test(page, "ops-email")
    assert webhook.titles() == [TEST_TITLE] and inbox.subjects() == [TEST_TITLE]

    # A rule: every failing event, at once, to both channels.
    page.get_by_role("link", name="Rules", exact=True).click()
    page.get_by_label("Name", exact=True).fill("GPU nodes failing")
    page.get_by_label("ops-webhook").check()
    page.get_by_label("ops-email").check()
    page.get_by_label("Minimum severity").select_option(label="Failing")
    page.get_by_label("Wait (minutes)").fill("0")
    page.get_by_role("button", name="Add rule").click()
    expect(page.get_by_text("Rule GPU nodes failing added.")).to_be_visible()
    rule = page.locator("tbody tr", has=page.get_by_role("rowheader", name="GPU nodes failing"))
    expect(rule).to_contain_text("0 min")
    expect(rule).to_contain_text("ops-email, ops-webhook")

    # A silence of the lab's nodes (a glob), from now for two hours (the form's default).
    page.get_by_role("link", name="Silences", exact=True).click()
    page.get_by_label("Nodes", exact=True).fill("h100-lab-*")
    page.get_by_label("Reason").fill("Re-cabling the lab rack")
    page.get_by_role("button", name="Add silence").click()
    expect(page.get_by_text("Nodes h100-lab-* silenced until")).to_be_visible()
    active = page.locator("section", has=page.get_by_role("heading", name="Active and coming"))
    expect(active.locator("tbody tr")).to_have_count(1)
    expect(active.locator("tbody tr")).to_contain_text("h100-lab-*")
    expect(active.locator("tbody tr .badge")).to_have_text("active")

    # Both nodes lose a GPU; their agents' snapshots go through Redis to the consumer.
    for node in (FAILING, SILENCED):
        gpu_falls_off_the_bus(fake_host, node, settings)
    consume({FAILING, SILENCED})
    for node in (FAILING, SILENCED):
        assert Node.objects.get(name=node).health == "fail"
        assert Event.objects.filter(node__name=node, code=f"lost:{LOST_PCI}", closed_at__isnull=True).exists()

    # The alerts, as the central beat runs them: one notification per channel, of the
    # failing node; the silenced node's are listed as silenced, and nothing more is due.
    run = alerts.run_once()
    assert (run.sent, run.failed) == (2, 0)
    assert alerts.run_once().planned == 0
    assert webhook.titles()[0] == TEST_TITLE and len(webhook.posts) == 2
    assert inbox.subjects()[0] == TEST_TITLE and len(inbox.messages) == 2
    for title, text in [(webhook.posts[1]["title"], webhook.posts[1]["message"]), (inbox.subjects()[1], inbox.text(1))]:
        assert FAILING in title and SILENCED not in title
        assert f"{FAILING}: GPU at PCI {LOST_PCI}" in text and "Xid 79" in text and SILENCED not in text
        assert f"{live_server.url}/events/?node={FAILING}" in text
    sent = Delivery.objects.filter(status=Status.SENT)
    assert sorted(sent.values_list("channel_name", flat=True)) == ["ops-email", "ops-webhook"]
    assert {e.node.name for d in sent for e in d.events.all()} == {FAILING}
    silenced = Delivery.objects.filter(status=Status.SILENCED)
    assert {e.node.name for d in silenced for e in d.events.all()} == {SILENCED}

    # Deliveries: the two sent, saying what they sent, and the two silenced.
    page.get_by_role("link", name="Deliveries", exact=True).click()
    rows = page.locator("#deliveries-table tbody tr")
    expect(rows).to_have_count(4)
    sent_rows = rows.filter(has=page.locator(".badge", has_text=re.compile("^sent$")))
    expect(sent_rows).to_have_count(2)
    for row in sent_rows.all():
        expect(row).to_contain_text("GPU nodes failing")
        expect(row).to_contain_text(FAILING)
        expect(row).to_contain_text("Opened")
    expect(rows.filter(has=page.locator(".badge", has_text=re.compile("^silenced$")))).to_have_count(2)
    page.get_by_label("Status").select_option(label="Sent")
    page.get_by_role("button", name="Apply").click()
    expect(rows).to_have_count(2)
    page.screenshot(path=artifacts / "alert-journey-deliveries.png", full_page=True)

    # Events: the failing node's lost GPU is open, and so is the silenced node's (recorded
    # all the same).
    page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile("^Events")).click()
    for node, other in [(FAILING, SILENCED), (SILENCED, FAILING)]:
        page.get_by_label("Node", exact=True).fill(node)
        page.get_by_role("button", name="Apply").click()
        table = page.locator("#events-table")
        expect(table.get_by_role("link", name=other)).to_have_count(0)
        lost = table.locator("tbody tr", has=page.get_by_role("link", name=node)).filter(has_text=f"lost:{LOST_PCI}")
        expect(lost).to_have_count(1)
        expect(lost).to_contain_text(f"GPU at PCI {LOST_PCI}")
        expect(lost.locator(".badge")).to_contain_text(["Failing", "open"])  # and whatever else it is marked
