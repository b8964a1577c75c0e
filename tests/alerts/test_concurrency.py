"""Two senders at once (two housekeeping workers, or the beat and `alerts --once`), on
PostgreSQL: each notification is delivered once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from gpufleet.alerts import services
from gpufleet.alerts.models import Delivery, DeliveryEvent, Rule, Status
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)

pytestmark = pytest.mark.postgresql


def _both_at_once(work, count: int = 2) -> list:
    return _at_once(*[work] * count)


def _at_once(*works) -> list:
    start, results, errors = threading.Barrier(len(works)), [], []

    def run(work):
        try:
            start.wait()
            results.append(work())
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    return results


def test_two_senders_at_once_deliver_each_notification_once(transactional_db, alert_settings, channels, inbox,
                                                             webhook):
    webhook.delay = 0.2  # a slow receiver: both senders are mid-send at once
    Rule.objects.filter(name="Failing or offline").delete()
    for i in range(4):
        rule = Rule.objects.create(name=f"rule {i}", min_severity=Severity.WARN, wait_minutes=5, created_at=T0)
        rule.channels.set(channels)
    nodes = Node.objects.bulk_create([Node(name=f"gpu-{i}") for i in range(3)])
    events.observe([Kind.FINDING], [n.pk for n in nodes], [
        events.Condition(n.pk, Kind.FINDING, "gpu0.xid", Severity.FAIL, "GPU 0 Xid 79") for n in nodes], T0)

    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        runs = _both_at_once(services.run_once)

    assert sum(run.planned for run in runs) == 4 * 2 * 3  # every notice planned once, by one of them
    assert sum(run.sent for run in runs) == 8
    assert len(webhook.posts) == 4 and len(inbox.messages) == 4
    assert sorted(webhook.titles()) == ["gpufleet: Failing: 3 findings on 3 nodes (gpu-0, gpu-1, gpu-2)"] * 4
    assert set(Delivery.objects.values_list("status", "tries")) == {(Status.SENT, 1)}

    with time_machine.travel(T0 + timedelta(minutes=6), tick=False):
        _both_at_once(services.run_once)
    assert len(webhook.posts) == 4 and len(inbox.messages) == 4


def test_a_sender_that_read_a_delivery_just_before_another_tried_it_waits_for_its_next_try(
        alert_settings, channels, webhook, monkeypatch):
    webhook.status = 500
    rule = Rule.objects.create(name="hook only", min_severity=Severity.WARN, wait_minutes=0, created_at=T0)
    rule.channels.set([channels[1]])
    node = Node.objects.create(name="gpu-0")
    events.observe([Kind.FINDING], [node.pk], [
        events.Condition(node.pk, Kind.FINDING, "gpu0.xid", Severity.FAIL, "GPU 0 Xid 79")], T0)
    now = T0 + timedelta(minutes=1)
    real_uuid4, tried = services.uuid.uuid4, []

    def another_sender_tries_first():
        # Called by claim() between reading the due delivery and taking it: meanwhile
        # another sender takes it, fails and puts it back for its next try.
        if not tried:
            tried.append("another sender")
            tried.append(services.deliver(*services.claim(now)))
        return real_uuid4()

    with time_machine.travel(now, tick=False):
        services.plan()
        monkeypatch.setattr(services.uuid, "uuid4", another_sender_tries_first)
        assert services.claim() is None
    assert tried == ["another sender", Status.PENDING]
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.tries, delivery.next_try_at) == (Status.PENDING, 1, now + timedelta(minutes=1))
    assert len(webhook.posts) == 1


def test_an_event_joining_a_notification_as_it_is_claimed_is_in_what_is_sent(
        transactional_db, alert_settings, channels, webhook, monkeypatch):
    alert_settings.GPUFLEET_ALERT_GROUP_S = 30
    rule = Rule.objects.create(name="hook only", min_severity=Severity.WARN, wait_minutes=0, created_at=T0)
    rule.channels.set([channels[1]])
    nodes = Node.objects.bulk_create([Node(name=f"gpu-{i}") for i in range(2)])

    def failing(node, at):
        events.observe([Kind.FINDING], [node.pk], [
            events.Condition(node.pk, Kind.FINDING, "gpu0.xid", Severity.FAIL, "GPU 0 Xid 79")], at)

    failing(nodes[0], T0)
    services.plan(T0)  # a notification that waits until T0 + 30 s for more
    failing(nodes[1], T0 + timedelta(seconds=29))
    planned, sender_done = threading.Event(), threading.Event()
    add_to_delivery = DeliveryEvent.objects.bulk_create

    def sender_goes_first(items):
        # The planner chose the notification to join; before it adds the event, a sender
        # claims that notification, and the planner goes on once the sender is done or
        # waits for it.
        planned.set()
        with connection.cursor() as cursor:
            for _ in range(200):
                if sender_done.wait(0.05):
                    break
                cursor.execute("SELECT count(*) FROM pg_stat_activity "
                               "WHERE wait_event_type = 'Lock' AND datname = current_database()")
                if cursor.fetchone()[0]:
                    break
        return add_to_delivery(items)

    def sender():
        assert planned.wait(10)
        services.deliver(*services.claim(T0 + timedelta(seconds=30)))
        sender_done.set()

    monkeypatch.setattr(DeliveryEvent.objects, "bulk_create", sender_goes_first)
    _at_once(lambda: services.plan(T0 + timedelta(seconds=29)), sender)

    assert webhook.titles() == ["gpufleet: Failing: 2 findings on 2 nodes (gpu-0, gpu-1)"]
