"""An idle claim is warned and then released end to end through the real beat: the
central beat's worker (celery worker -B on the housekeeping queue, as deployed) tells the
owner by email over real SMTP and the alert channels through a real webhook, then, still
idle after the grace, releases the claim through the delete path and tells the owner."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.alerts.models import Channel, Rule
from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event, Kind
from tests.integration.workers import celery_worker, database_url_for_workers, wait_for
from tests.usage.owner_mail import SITE, idle_claim, port_of

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

GRACE_HOURS = 0.002  # 7.2 s


def test_an_idle_claim_is_warned_and_then_released_end_to_end_through_the_real_beat(
        own_redis, inbox, webhook, settings, operator, tmp_path):
    operator.email = "otto@example.com"
    operator.save()
    claim = idle_claim(settings, operator)  # 2 GPUs idle for 90 minutes, as ingest stored them
    rule = Rule.objects.create(name="claims", kinds=[Kind.CLAIM_IDLE, Kind.CLAIM_RELEASED], min_severity="info",
                               wait_minutes=0, notify_resolved=False, created_at=claim.created_at - timedelta(hours=2))
    rule.channels.set([Channel.objects.create(name="owners", url=webhook.url, redacted="json://…")])
    env = {"CELERY_BROKER_URL": own_redis.url, "DATABASE_URL": database_url_for_workers(),
           "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_NODE_NAME": "central", "GPUFLEET_COLLECT_INTERVAL": "1",
           "GPUFLEET_RELEASE_IDLE": "true", "GPUFLEET_IDLE_GRACE_HOURS": str(GRACE_HOURS),
           "GPUFLEET_EMAIL_HOST": "127.0.0.1", "GPUFLEET_EMAIL_PORT": str(port_of(inbox)),
           "GPUFLEET_EMAIL_FROM": "gpufleet@example.com", "GPUFLEET_SITE_URL": SITE,
           "GPUFLEET_ALERT_TICK_S": "1", "GPUFLEET_ALERT_GROUP_S": "0",
           "GPUFLEET_ALERT_ALLOW_PRIVATE": "true"}  # the webhook is on loopback

    with celery_worker("beat", "housekeeping", env, beat_file=tmp_path / "beat") as beat:
        told = wait_for(lambda: Claim.objects.filter(pk=claim.pk, idle_warned_at__isnull=False).first(), 30,
                        "the owner to be told", (beat,))
        assert Claim.objects.filter(pk=claim.pk).exists()  # kept through the grace
        wait_for(lambda: not Claim.objects.filter(pk=claim.pk).exists(), 40, "the claim to be released", (beat,))
        wait_for(lambda: len(inbox.messages) == 2 and len(webhook.posts) == 2, 20,
                 "the owner's emails and the channel's notifications", (beat,))

    assert inbox.subjects() == ["gpufleet: your claim train on alpha is idle",
                                "gpufleet: your idle claim train on alpha was released"]
    assert all(message["To"] == "otto@example.com" for message in inbox.messages)
    warning = inbox.text(0)
    assert "3.0 GPU-hours reserved and unused" in warning
    assert f"{SITE}/nodes/alpha/#claim-{claim.pk}" in warning
    assert f"It will be released at {told.idle_warned_at + timedelta(hours=GRACE_HOURS):%Y-%m-%d %H:%M} UTC" in warning
    assert "was released: none of its GPUs did any work since" in inbox.text(1)

    entry = AuditEntry.objects.get(action="claim.delete")
    assert (entry.user, entry.target, str(entry).split()[2]) == (None, "train", "system")
    assert entry.at - told.idle_warned_at >= timedelta(hours=GRACE_HOURS)
    released = Event.objects.get(kind=Kind.CLAIM_RELEASED)
    assert released.message == "Claim 'train' released by the system, as it stayed idle after its owner was told"
    assert sorted(webhook.titles()) == ["gpufleet: Claim idle (warning): alpha Claim train idle",
                                     "gpufleet: Claim released: alpha Claim train"]
