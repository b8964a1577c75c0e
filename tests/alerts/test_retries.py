"""A channel that is down loses nothing: a notification is tried again, further apart up
to GPUFLEET_ALERT_RETRY_MAX_S, while its events are open (a recovery, and a notice of
events closed since, for GPUFLEET_ALERT_GIVE_UP_HOURS); once the channel answers it gets
what it missed, oldest first and grouped, and it shows failing until then."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Delivery, Rule, Status
from gpufleet.fleet.models import Node
from tests.alerts.conftest import T0
from tests.alerts.test_sending import cleared, failing, tick


@pytest.fixture
def retry_settings(alert_settings):
    alert_settings.GPUFLEET_ALERT_RETRY_MAX_S = 600
    alert_settings.GPUFLEET_ALERT_GIVE_UP_HOURS = 2
    return alert_settings


def ticks(start, end, every=timedelta(seconds=30)):
    at = start
    while at <= end:
        tick(at)
        at += every


def hook_is_failing(client) -> bool:
    """What the Channels page, the overview and /metrics say of the webhook channel."""
    page = client.get("/alerts/channels/").content.decode()
    row = page[page.index(">hook<"):].split("</tr>", 1)[0]
    overview = client.get("/").content.decode()
    metrics = client.get("/metrics").content.decode()
    shown = ("badge-red\">failing" in row, "1 alert channel failing" in overview,
             'gpufleet_alert_channel_failing{channel="hook"} 1.0' in metrics)
    assert len(set(shown)) == 1, shown
    return shown[0]


def test_a_channel_down_for_an_hour_gets_every_notice_once_in_order_with_the_recovery(
        retry_settings, rule, inbox, webhook, admin_role_client):
    c_only = Rule.objects.create(name="c only", nodes="c", min_severity="fail", wait_minutes=0, created_at=T0)
    c_only.channels.set(Channel.objects.filter(name="hook"))
    a, b, c = Node.objects.bulk_create([Node(name=n) for n in ("a", "b", "c")])
    webhook.status = 503
    failing([a], T0)
    ticks(T0, T0 + timedelta(minutes=9, seconds=30))
    failing([a, b], T0 + timedelta(minutes=10))
    ticks(T0 + timedelta(minutes=10), T0 + timedelta(minutes=19, seconds=30))
    failing([a, b, c], T0 + timedelta(minutes=20))
    ticks(T0 + timedelta(minutes=20), T0 + timedelta(minutes=29, seconds=30))
    failing([b, c], T0 + timedelta(minutes=30))
    cleared([a], T0 + timedelta(minutes=30))
    ticks(T0 + timedelta(minutes=30), T0 + timedelta(minutes=64, seconds=30))

    with time_machine.travel(T0 + timedelta(minutes=64, seconds=30), tick=False):
        assert hook_is_failing(admin_role_client)
    assert webhook.accepted() == [] and len(webhook.posts) == 9  # at 5, 6, 8, 12, 20, 30, 40, 50, 60 minutes
    waiting = Delivery.objects.get(channel__name="hook", rule=rule)
    assert (waiting.status, waiting.next_try_at) == (Status.PENDING, T0 + timedelta(minutes=70))
    assert "503" in waiting.error and "503" in Channel.objects.get(name="hook").last_error

    webhook.status = 200
    ticks(T0 + timedelta(minutes=65), T0 + timedelta(minutes=79, seconds=30))
    with time_machine.travel(T0 + timedelta(minutes=79, seconds=30), tick=False):
        assert not hook_is_failing(admin_role_client)
    cleared([b, c], T0 + timedelta(minutes=80))
    ticks(T0 + timedelta(minutes=80), T0 + timedelta(minutes=90))

    assert [post["title"] for post in webhook.accepted()] == [
        "gpufleet: GPU failing: 3 GPUs on 3 nodes (a, b, c)",  # what it missed, grouped
        "gpufleet: GPU failing: c GPU 3 (Xid 79)",  # the other rule's, made later
        "gpufleet: Resolved: GPU failing: a GPU 3 (Xid 79)",  # a's recovery, only once a was announced
        "gpufleet: Resolved: GPU failing: 2 GPUs on 2 nodes (b, c)",
        "gpufleet: Resolved: GPU failing: c GPU 3 (Xid 79)",
    ]
    assert len(webhook.posts) == 9 + 5
    assert inbox.subjects() == [
        "gpufleet: GPU failing: a GPU 3 (Xid 79)", "gpufleet: GPU failing: b GPU 3 (Xid 79)",
        "gpufleet: GPU failing: c GPU 3 (Xid 79)", "gpufleet: Resolved: GPU failing: a GPU 3 (Xid 79)",
        "gpufleet: Resolved: GPU failing: 2 GPUs on 2 nodes (b, c)"]
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SENT}


def test_a_notice_of_open_events_is_tried_for_as_long_as_they_stay_open_at_most_the_longest_wait_apart(
        retry_settings, rule, webhook):
    node = Node.objects.create(name="gpu-a01")
    webhook.status = 503
    failing([node], T0)
    tries = []
    for hours in range(31):
        tick(T0 + timedelta(hours=hours, minutes=5))
        delivery = Delivery.objects.get(channel__name="hook")
        tries.append(delivery.tries)
        assert delivery.status == Status.PENDING
        assert delivery.next_try_at - (T0 + timedelta(hours=hours, minutes=5)) <= timedelta(minutes=10)
    assert tries[-1] == 31 and len(webhook.posts) == 31  # one try at each tick: each was due


def test_a_recovery_gives_up_after_the_give_up_hours_and_the_channel_stays_failing(
        retry_settings, rule, webhook, inbox):
    node = Node.objects.create(name="gpu-a01")
    failing([node], T0)
    tick(T0 + timedelta(minutes=5))
    assert webhook.titles() == ["gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)"]
    webhook.status = 503
    cleared([node], T0 + timedelta(minutes=10))
    ticks(T0 + timedelta(minutes=10), T0 + timedelta(hours=2, minutes=9), every=timedelta(minutes=1))
    resolved = Delivery.objects.get(channel__name="hook", notice="resolved")
    assert resolved.status == Status.PENDING
    ticks(T0 + timedelta(hours=2, minutes=10), T0 + timedelta(hours=3), every=timedelta(minutes=1))
    resolved.refresh_from_db()
    assert resolved.status == Status.FAILED and "503" in resolved.error
    tried = len(webhook.posts)
    ticks(T0 + timedelta(hours=3), T0 + timedelta(hours=5), every=timedelta(minutes=10))
    assert len(webhook.posts) == tried
    assert services.failing_channels() == 1 and inbox.subjects()[-1].startswith("gpufleet: Resolved:")

    # The next notification that gets through: the channel works again.
    webhook.status = 200
    failing([node], T0 + timedelta(hours=5))
    tick(T0 + timedelta(hours=5, minutes=5))
    assert webhook.titles()[-1] == "gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)"
    assert services.failing_channels() == 0
