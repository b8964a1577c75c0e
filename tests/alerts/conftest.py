"""The alert tests' settings, channels and rule; the receivers they send to (the
`inbox` SMTP server and the `webhook` HTTP server) are in tests/receivers.py."""

from __future__ import annotations

import pytest

from gpufleet.alerts.models import Channel, Rule


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
