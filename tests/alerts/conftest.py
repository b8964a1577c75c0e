"""The alert tests' settings, channels and rule; the receivers they send to (the
`inbox` SMTP server and the `webhook` HTTP server) are in tests/receivers.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Rule
from gpufleet.events import services as events
from gpufleet.events.models import Kind, Severity
from gpufleet.fleet.models import Node

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)


def gpu_a01_failing() -> Node:
    """gpu-a01, its GPU 0 failing with Xid 79 from T0: an event the shipped rule sends."""
    node = Node.objects.create(name="gpu-a01")
    events.observe([Kind.FINDING], [node.pk], [events.Condition(node.pk, Kind.FINDING, "gpu0.xid", Severity.FAIL,
                                                               "GPU 0 Xid 79")], T0)
    return node


def tick(at):
    """One round of the sender at `at`."""
    with time_machine.travel(at, tick=False):
        return services.run_once()


def gpu3(node, at, failing=True):
    """The node's GPU 3 seen failing with Xid 79 at `at` (or seen well again)."""
    conditions = [events.Condition(node.pk, Kind.FINDING, "gpu3.xid", Severity.FAIL, "GPU 3 Xid 79",
                                   "GPU 3 fell off the bus (Xid 79)", 3)] if failing else []
    events.observe([Kind.FINDING], [node.pk], conditions, at)


@pytest.fixture
def alert_settings(settings):
    """Send at once (no grouping wait), retry soon, events open and close at once."""
    settings.GPUFLEET_ALERT_GROUP_S = 0
    settings.GPUFLEET_ALERT_RETRY_S = 60
    settings.GPUFLEET_ALERT_CLAIM_TIMEOUT_S = 300
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 0
    settings.GPUFLEET_EVENT_CLOSE_AFTER_S = 0
    settings.GPUFLEET_SITE_URL = "https://fleet.example.com"
    return settings


@pytest.fixture
def channels(db, inbox, webhook):
    return (Channel.objects.create(name="email", url=inbox.url, redacted="mailto://…"),
            Channel.objects.create(name="hook", url=webhook.url, redacted="json://…"))


@pytest.fixture
def rule(channels):
    """The default rule that ships, given both channels."""
    shipped = Rule.objects.get(name="Failing or offline")
    shipped.channels.set(channels)
    return shipped
