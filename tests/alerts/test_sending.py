"""Alerts reach real receivers on loopback (an SMTP server, a JSON webhook) once per
event, rule and channel: after the rule's wait, with the recovery after, never for a
silenced node, grouped when many come at once, retried when a send fails."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.management import call_command

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Delivery, Rule, Silence, Status
from gpufleet.events import services as events
from gpufleet.events.models import Event, Kind, Severity
from gpufleet.fleet.models import Maintenance, Node
from tests.receivers import WEBHOOK_PASSWORD, WEBHOOK_TOKEN

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
XID = "gpu3.xid"


def failing(nodes, at, code=XID, severity=Severity.FAIL):
    """Each node's GPU 3 failing with Xid 79 from `at` (the nodes given, and no other, fail)."""
    events.observe([Kind.FINDING], [n.pk for n in nodes], [
        events.Condition(n.pk, Kind.FINDING, code, severity, "GPU 3 Xid 79", "GPU 3 fell off the bus (Xid 79)", 3)
        for n in nodes
    ], at)


def cleared(nodes, at):
    events.observe([Kind.FINDING], [n.pk for n in nodes], [], at)


def tick(at):
    with time_machine.travel(at, tick=False):
        return services.run_once()


@pytest.fixture
def node(db):
    return Node.objects.create(name="gpu-a01", gpu_models="NVIDIA H100 80GB HBM3")


def test_a_failing_gpu_reaches_the_inbox_and_the_webhook_once_after_the_wait_then_its_recovery(
        alert_settings, rule, node, inbox, webhook):
    failing([node], T0)
    tick(T0 + timedelta(minutes=4, seconds=50))
    assert inbox.messages == [] and webhook.posts == []

    tick(T0 + timedelta(minutes=5))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1
    assert inbox.subjects() == ["gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)"] == webhook.titles()
    text = inbox.text(0)
    assert "Failing or offline: opened: 1 failing, on 1 node." in text
    assert "gpu-a01: GPU 3 Xid 79 (failing, since 2026-03-02 03:00 UTC): GPU 3 fell off the bus" in text
    assert ("Events: https://fleet.example.com/events/?node=gpu-a01&kind=finding&severity=fail&state=open"
            "&since=2026-03-02T03%3A00%3A00%2B00%3A00&until=2026-03-02T03%3A00%3A00%2B00%3A00") in text
    assert webhook.posts[0]["path"] == f"/hooks/{WEBHOOK_TOKEN}" and webhook.posts[0]["authorization"]

    # Still failing: a tick later, and the next, nothing more is sent.
    failing([node], T0 + timedelta(minutes=6))
    tick(T0 + timedelta(minutes=6))
    tick(T0 + timedelta(hours=3))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1

    cleared([node], T0 + timedelta(hours=3, minutes=1))
    tick(T0 + timedelta(hours=3, minutes=1))
    assert inbox.subjects()[1] == "gpufleet: Resolved: GPU failing: gpu-a01 GPU 3 (Xid 79)" == webhook.titles()[1]
    assert "03:00–06:01 UTC" in inbox.text(1)
    tick(T0 + timedelta(hours=4))
    assert len(inbox.messages) == 2 and len(webhook.posts) == 2
    assert list(Delivery.objects.values_list("notice", "status", "tries").order_by("id")) == [
        ("opened", "sent", 1), ("opened", "sent", 1), ("resolved", "sent", 1), ("resolved", "sent", 1)]


def test_an_event_that_closes_within_the_wait_sends_nothing(alert_settings, rule, node, inbox, webhook):
    failing([node], T0)
    tick(T0 + timedelta(minutes=1))
    cleared([node], T0 + timedelta(minutes=2))
    tick(T0 + timedelta(minutes=10))
    assert inbox.messages == [] and webhook.posts == [] and not Delivery.objects.exists()


def test_the_shipped_rule_sends_nothing_until_it_has_a_channel(alert_settings, node, inbox, webhook):
    failing([node], T0)
    assert tick(T0 + timedelta(hours=1)).planned == 0
    assert not Delivery.objects.exists()


def test_a_warning_is_below_the_shipped_rule(alert_settings, rule, node, inbox, webhook):
    failing([node], T0, severity=Severity.WARN)
    tick(T0 + timedelta(hours=1))
    assert inbox.messages == [] and webhook.posts == []


def test_a_silenced_node_sends_nothing_but_its_events_are_recorded_and_the_delivery_marked(
        alert_settings, rule, node, inbox, webhook):
    Silence.objects.create(nodes="gpu-a*", starts_at=T0, ends_at=T0 + timedelta(hours=2), reason="reboots")
    failing([node], T0)
    tick(T0 + timedelta(minutes=10))
    cleared([node], T0 + timedelta(minutes=20))
    tick(T0 + timedelta(minutes=20))
    assert inbox.messages == [] and webhook.posts == []
    assert Event.objects.filter(node=node, closed_at__isnull=False).count() == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SILENCED}


def test_a_node_in_maintenance_sends_nothing_but_its_events_are_recorded(
        alert_settings, rule, node, inbox, webhook, admin_user):
    Maintenance.objects.create(node=node, until=T0 + timedelta(hours=2), reason="new PSU", author=admin_user,
                               started_at=T0 - timedelta(minutes=1))
    failing([node], T0)
    tick(T0 + timedelta(minutes=10))
    assert inbox.messages == [] and webhook.posts == []
    assert Event.objects.filter(node=node, closed_at__isnull=True).count() == 1
    assert set(Delivery.objects.values_list("status", flat=True)) == {Status.SILENCED}


def test_a_node_whose_maintenance_ended_is_heard_again(alert_settings, rule, node, inbox, webhook, admin_user):
    Maintenance.objects.create(node=node, until=T0 + timedelta(minutes=30), reason="new PSU", author=admin_user,
                               started_at=T0 - timedelta(minutes=1))
    failing([node], T0 + timedelta(minutes=40))
    tick(T0 + timedelta(minutes=45))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1


def test_a_silence_ending_leaves_the_node_heard_again(alert_settings, rule, node, inbox, webhook):
    Silence.objects.create(nodes="gpu-a01", starts_at=T0, ends_at=T0 + timedelta(minutes=30), reason="reboots")
    failing([node], T0 + timedelta(minutes=40))
    tick(T0 + timedelta(minutes=45))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1


def test_two_hundred_nodes_offline_at_once_are_one_notification_per_rule_and_channel(
        alert_settings, rule, inbox, webhook):
    alert_settings.GPUFLEET_ALERT_GROUP_S = 30
    Node.objects.bulk_create([Node(name=f"rack4-{i:03d}", offline=True, last_seen=T0) for i in range(200)])
    with time_machine.travel(T0, tick=False):
        events.record_offline(Node.objects.values_list("pk", "last_seen"), T0)
    tick(T0 + timedelta(minutes=5))  # due now: a delivery that waits out the grouping window
    assert inbox.messages == [] and webhook.posts == []
    tick(T0 + timedelta(minutes=5, seconds=30))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1
    assert webhook.titles() == ["gpufleet: Not reporting: 200 nodes (rack4-000, rack4-001, rack4-002 and 197 more)"]
    text = inbox.text(0)
    assert "opened: 200 failing, on 200 nodes." in text
    assert text.count("Not reporting (failing") == services.LISTED and "- and 150 more" in text
    assert "Events: https://fleet.example.com/events/?kind=offline&severity=fail&state=open&since=" in text
    tick(T0 + timedelta(minutes=10))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1


def test_events_due_within_the_window_join_its_notification(alert_settings, rule, inbox, webhook):
    alert_settings.GPUFLEET_ALERT_GROUP_S = 30
    first, second, third = Node.objects.bulk_create([Node(name=n) for n in ("a", "b", "c")])
    failing([first], T0)
    failing([first, second], T0 + timedelta(seconds=20))
    tick(T0 + timedelta(minutes=5))
    tick(T0 + timedelta(minutes=5, seconds=20))
    failing([first, second, third], T0 + timedelta(seconds=40))
    tick(T0 + timedelta(minutes=5, seconds=30))
    assert webhook.titles() == ["gpufleet: GPU failing: 2 GPUs on 2 nodes (a, b)"]
    tick(T0 + timedelta(minutes=5, seconds=40))
    tick(T0 + timedelta(minutes=6, seconds=10))
    assert webhook.titles()[1:] == ["gpufleet: GPU failing: c GPU 3 (Xid 79)"]


def test_a_rule_repeats_every_n_hours_while_open(alert_settings, rule, node, inbox, webhook):
    Rule.objects.filter(pk=rule.pk).update(repeat_hours=2)
    failing([node], T0)
    for minutes in (5, 60, 124, 125, 180, 245, 300):
        tick(T0 + timedelta(minutes=minutes))
    assert webhook.titles() == ["gpufleet: GPU failing: gpu-a01 GPU 3 (Xid 79)",
                                "gpufleet: Still open: GPU failing: gpu-a01 GPU 3 (Xid 79)",
                                "gpufleet: Still open: GPU failing: gpu-a01 GPU 3 (Xid 79)"]


def test_a_rule_selects_by_kind_node_glob_and_gpu_model(alert_settings, channels, inbox, webhook):
    picky = Rule.objects.create(name="H100 racks", kinds=[Kind.FINDING], min_severity=Severity.WARN, nodes="gpu-*",
                                gpu_model="h100", wait_minutes=0, created_at=T0)
    picky.channels.set(channels[1:])
    h100, a100, other = Node.objects.bulk_create([
        Node(name="gpu-1", gpu_models="NVIDIA H100 80GB HBM3"), Node(name="gpu-2", gpu_models="NVIDIA A100"),
        Node(name="cpu-1", gpu_models="NVIDIA H100 80GB HBM3")])
    failing([h100, a100, other], T0, severity=Severity.WARN)
    with time_machine.travel(T0, tick=False):
        events.record_offline([(h100.pk, T0)], T0)
    tick(T0 + timedelta(seconds=1))
    assert webhook.titles() == ["gpufleet: GPU warning: gpu-1 GPU 3 (Xid 79)"]


def test_one_off_events_are_sent_at_once_without_a_recovery(alert_settings, channels, node, inbox, webhook):
    keys = Rule.objects.create(name="keys", kinds=[Kind.KEY_REVOKED], min_severity=Severity.INFO, wait_minutes=5,
                               created_at=T0)
    keys.channels.set(channels[1:])
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        events.key_changed(node.name, revoked=True)
    tick(T0 + timedelta(minutes=1))
    tick(T0 + timedelta(minutes=30))
    assert webhook.titles() == ["gpufleet: Node key revoked (warning): gpu-a01"]


def test_a_failing_channel_is_tried_again_further_apart_and_marked_failing_until_a_send_works(
        alert_settings, rule, node, inbox, webhook, caplog):
    webhook.status = 500
    failing([node], T0)
    tick(T0 + timedelta(minutes=5))
    hook = Channel.objects.get(name="hook")
    delivery = Delivery.objects.get(channel=hook)
    assert (delivery.status, delivery.tries) == (Status.PENDING, 1) and "500" in delivery.error
    assert delivery.next_try_at == T0 + timedelta(minutes=6)
    assert services.failing_channels() == 1
    tick(T0 + timedelta(minutes=6))
    delivery.refresh_from_db()
    assert (delivery.status, delivery.tries, delivery.next_try_at) == (Status.PENDING, 2, T0 + timedelta(minutes=8))
    tick(T0 + timedelta(minutes=8))
    delivery.refresh_from_db()
    hook.refresh_from_db()
    assert (delivery.status, delivery.tries, delivery.next_try_at) == (Status.PENDING, 3, T0 + timedelta(minutes=12))
    assert hook.failing and services.failing_channels() == 1 and "500" in hook.last_error
    assert len(webhook.posts) == 3 and len(inbox.messages) == 1

    webhook.status = 200
    tick(T0 + timedelta(minutes=12))
    hook.refresh_from_db()
    assert not hook.failing and services.failing_channels() == 0 and len(webhook.accepted()) == 1
    logged = caplog.text
    assert WEBHOOK_PASSWORD not in logged and WEBHOOK_TOKEN not in logged


def test_a_send_claimed_by_a_sender_that_died_is_sent_once_after_the_claim_times_out(
        alert_settings, rule, node, inbox, webhook):
    failing([node], T0)
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        services.plan()
        crashed = [services.claim(), services.claim()]  # claimed, never sent: both senders "died"
        assert all(crashed) and services.claim() is None
        services.send_due()
    assert inbox.messages == [] and webhook.posts == []
    tick(T0 + timedelta(minutes=9, seconds=59))
    assert inbox.messages == [] and webhook.posts == []
    tick(T0 + timedelta(minutes=10, seconds=1))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1
    assert list(Delivery.objects.values_list("status", "tries")) == [(Status.SENT, 2), (Status.SENT, 2)]
    tick(T0 + timedelta(minutes=30))
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1


def test_a_late_sender_cannot_overwrite_what_the_sender_that_took_over_recorded(
        alert_settings, rule, node, inbox, webhook):
    rule.channels.set([Channel.objects.get(name="hook")])
    failing([node], T0)
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        services.plan()
        delivery, first = services.claim()
    with time_machine.travel(T0 + timedelta(minutes=11), tick=False):
        taken, second = services.claim()
        assert services.deliver(taken, second) == Status.SENT
        webhook.status = 500
        services.deliver(delivery, first)  # the first sender wakes up and fails
    delivery.refresh_from_db()
    assert delivery.status == Status.SENT and delivery.error == ""


def test_the_command_sends_what_is_due(alert_settings, rule, node, inbox, webhook, capsys):
    failing([node], T0)
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        call_command("alerts", "--once")
    assert "2 notice(s) due, 2 notification(s) sent, 0 failed for good" in capsys.readouterr().out
    assert len(inbox.messages) == 1 and len(webhook.posts) == 1


def test_the_beat_sends_alerts_on_the_housekeeping_queue(settings):
    from gpufleet.alerts import tasks

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == tasks.send_alerts.name)
    assert entry["schedule"] == settings.GPUFLEET_ALERT_TICK_S
    assert settings.CELERY_TASK_ROUTES["gpufleet.alerts.tasks.*"] == {"queue": settings.HOUSEKEEPING_QUEUE}


def test_apprise_lines_never_reach_the_logs(alert_settings, rule, node, inbox, webhook, caplog):
    caplog.set_level(logging.DEBUG)
    failing([node], T0)
    tick(T0 + timedelta(minutes=5))
    # A channel's Test goes through apprise's own JSON plugin (and urllib3 under it).
    assert services.send_test(Channel.objects.get(name="hook")).sent
    assert len(webhook.posts) == 2
    assert not [r for r in caplog.records if r.name.startswith("apprise")]
    ours = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("mail.log"))  # the test's SMTP server
    assert WEBHOOK_PASSWORD not in ours and WEBHOOK_TOKEN not in ours and '"POST … HTTP/1.1" 200' in ours
    assert "alert" in ours  # our own line says it was sent, without the URL


def test_the_apprise_type_follows_the_notice_failure_then_success_and_warning_for_a_warning(
        alert_settings, channels, inbox, webhook):
    hooked = Rule.objects.create(name="warnings too", min_severity=Severity.WARN, wait_minutes=0, created_at=T0)
    hooked.channels.set(channels[1:])
    failing_node, warning_node = Node.objects.bulk_create([Node(name="gpu-a01"), Node(name="gpu-b01")])
    failing([failing_node], T0)
    tick(T0 + timedelta(seconds=1))
    events.observe([Kind.FINDING], [warning_node.pk], [events.Condition(
        warning_node.pk, Kind.FINDING, "toolkit", Severity.WARN, "NVIDIA Container Toolkit", "not installed")],
        T0 + timedelta(minutes=1))
    tick(T0 + timedelta(minutes=1))
    cleared([failing_node], T0 + timedelta(minutes=2))
    tick(T0 + timedelta(minutes=2))
    assert [(post["title"].split(":")[1].strip(), post["type"]) for post in webhook.posts] == [
        ("GPU failing", "failure"), ("Warning", "warning"), ("Resolved", "success")]
    services.send_test(Channel.objects.get(name="hook"))
    assert webhook.posts[-1]["type"] == "info"
