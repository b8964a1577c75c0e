"""Two senders at once (two housekeeping workers, or the beat and `alerts --once`), on
PostgreSQL: each notification is delivered once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from gpufleet.alerts import services
from gpufleet.alerts.models import Delivery, Rule, Status
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)

pytestmark = pytest.mark.postgresql


def _both_at_once(work, count: int = 2) -> list:
    start, results, errors = threading.Barrier(count), [], []

    def run():
        try:
            start.wait()
            results.append(work())
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(count)]
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
    assert sorted(webhook.titles()) == ["gpufleet: 3 events on 3 nodes (gpu-0, gpu-1, gpu-2)"] * 4
    assert set(Delivery.objects.values_list("status", "tries")) == {(Status.SENT, 1)}

    with time_machine.travel(T0 + timedelta(minutes=6), tick=False):
        _both_at_once(services.run_once)
    assert len(webhook.posts) == 4 and len(inbox.messages) == 4
