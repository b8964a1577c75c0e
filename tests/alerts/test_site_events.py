"""The site's own events (no node) go to rules without a node selector: the shipped rule
announces the site receiving no snapshots, and its recovery, through a real webhook."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.alerts import services
from gpufleet.alerts.models import Delivery, Rule, Silence, Status
from gpufleet.events.models import Event, Kind, Muted
from gpufleet.fleet import tasks as fleet_tasks
from gpufleet.fleet.models import NodeCredential
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import snapshot

T0 = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)


@pytest.fixture
def silence_settings(alert_settings):
    # Offline after 3 x 120 s: at the silence time no node is offline yet, so the
    # site's event is the only one due.
    alert_settings.GPUFLEET_COLLECT_INTERVAL = 120
    alert_settings.GPUFLEET_INGEST_SILENCE_ALERT_S = 300
    return alert_settings


def store(name: str, at: datetime) -> None:
    assert ingest_snapshot(snapshot(name, gpus=1, at=at), now=at).outcome == "accepted"


def beat_and_tick(at: datetime):
    with time_machine.travel(at, tick=False):
        fleet_tasks.mark_offline()
        return services.run_once()


def test_the_shipped_rule_selects_the_site_receiving_no_snapshots(db):
    shipped = Rule.objects.get(name="Failing or offline")
    assert shipped.matches(Kind.INGEST_SILENT, "fail", None)


def test_the_site_receiving_no_snapshots_reaches_the_webhook_after_the_wait_then_its_recovery(
        silence_settings, rule, webhook, inbox):
    NodeCredential.objects.create(name="gpu-a01", issued_at=T0 - timedelta(days=1))
    store("gpu-a01", T0 - timedelta(minutes=5))
    beat_and_tick(T0)
    event = Event.objects.get(kind=Kind.INGEST_SILENT)
    assert event.node_id is None and webhook.posts == []

    beat_and_tick(T0 + timedelta(minutes=5))
    assert webhook.titles() == ["gpufleet: No snapshots arriving (failing): the site"]
    assert "the last one was stored 2026-03-02 02:55 UTC" in webhook.posts[0]["message"]

    store("gpu-a01", T0 + timedelta(minutes=6))
    beat_and_tick(T0 + timedelta(minutes=6))
    assert webhook.titles()[1:] == ["gpufleet: Resolved: No snapshots arriving (failing): the site"]
    assert list(Delivery.objects.filter(channel__name="hook").values_list("notice", "status").order_by("id")) == [
        ("opened", Status.SENT), ("resolved", Status.SENT)]


def test_a_silence_of_every_node_mutes_the_site_too(silence_settings, rule, webhook, inbox):
    Silence.objects.create(nodes="*", starts_at=T0 - timedelta(hours=1), ends_at=T0 + timedelta(hours=1),
                           reason="moving the broker")
    NodeCredential.objects.create(name="gpu-a01", issued_at=T0 - timedelta(days=1))
    store("gpu-a01", T0 - timedelta(minutes=5))
    beat_and_tick(T0)
    beat_and_tick(T0 + timedelta(minutes=10))
    assert webhook.posts == [] and inbox.messages == []
    assert Event.objects.get(kind=Kind.INGEST_SILENT).muted == Muted.SILENCED
