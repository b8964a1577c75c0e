"""Idle claims handed back: the owner of a claim whose GPUs did nothing for
GPUFLEET_IDLE_HOURS is told once (email over real SMTP, a claim-idle event the alert
rules route), with the GPU-hours it held unused and a link; with GPUFLEET_RELEASE_IDLE it
is released after the grace through the delete path, audited by "system", and the owner
told again. Work on its GPUs ends the spell and its warning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.utils import timezone

from gpufleet import gpu
from gpufleet.alerts import services as alerts
from gpufleet.alerts.models import Channel, Rule
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event, Kind
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.usage import idle, tasks
from gpufleet.usage.report import report
from tests.factories import snapshot
from tests.usage.owner_mail import SITE, STEP, idle_claim, mail_fixture, owner_fixture, quiet  # noqa: F401 (the mail and owner fixtures)

pytestmark = pytest.mark.django_db


def test_the_owner_of_an_idle_claim_is_told_once_with_the_hours_wasted_and_a_link(settings, mail, owner):
    claim = idle_claim(settings, owner)
    now = timezone.now()
    wasted = report(claim.idle_since, now, "claim", {"claim_id": claim.pk}).total.idle_reserved
    assert wasted == pytest.approx(3.0)  # 2 GPUs, 18 five-minute snapshots

    assert tasks.idle_claims() == {"warned": ["train on alpha"], "released": []}
    (message,) = mail.messages
    assert message["To"] == "otto@example.com" and message["From"] == "gpufleet@example.com"
    assert message["Subject"] == "gpufleet: your claim train on alpha is idle"
    text = mail.text(0)
    assert (f"Claim 'train' (2 GPUs) on alpha has done no work since {claim.idle_since:%Y-%m-%d %H:%M} UTC: "
            "3.0 GPU-hours reserved and unused.") in text
    assert f"{SITE}/nodes/alpha/#claim-{claim.pk}" in text
    assert "released" not in text  # GPUFLEET_RELEASE_IDLE is off
    event = Event.objects.get(kind=Kind.CLAIM_IDLE)
    assert (event.node.name, event.claim_name, event.severity, event.name) == ("alpha", "train", "warn",
                                                                               "Claim train idle")
    assert event.message in text
    assert Claim.objects.get(pk=claim.pk).idle_warned_at is not None

    # However often the beat runs, one warning per idle spell.
    assert idle.run() == idle.Outcome()
    assert len(mail.messages) == 1 and Event.objects.filter(kind=Kind.CLAIM_IDLE).count() == 1


def test_the_warning_reaches_the_alert_channels_of_a_rule_for_idle_claims(settings, mail, owner, webhook):
    settings.GPUFLEET_ALERT_GROUP_S = 0
    rule = Rule.objects.create(name="idle claims", kinds=[Kind.CLAIM_IDLE, Kind.CLAIM_RELEASED], min_severity="info",
                               wait_minutes=0)
    rule.channels.set([Channel.objects.create(name="hook", url=webhook.url, redacted="json://…")])
    idle_claim(settings, owner)
    idle.run()
    alerts.run_once()
    assert webhook.titles() == ["gpufleet: Claim idle (warning): alpha Claim train idle"]
    assert "3.0 GPU-hours reserved and unused" in webhook.posts[0]["message"]


def test_work_on_its_gpus_ends_the_spell_and_a_new_spell_is_told_again(settings, mail, owner):
    claim = idle_claim(settings, owner)
    idle.run()
    quiet("alpha", 2, claim.node.collected_at + STEP, busy=True)
    assert Claim.objects.get(pk=claim.pk).idle_since is None  # ingest saw the work
    idle.run()
    assert Claim.objects.get(pk=claim.pk).idle_warned_at is None
    # Idle again (as ingest would flag it an idle rule's hours later): told again.
    Claim.objects.filter(pk=claim.pk).update(idle_since=timezone.now() - timedelta(hours=2))
    assert idle.run().warned == ["train on alpha"]
    assert len(mail.messages) == 2


def test_without_release_the_claim_is_kept_however_long_it_stays_idle(settings, mail, owner):
    claim = idle_claim(settings, owner)
    idle.run()
    assert idle.run(now=timezone.now() + timedelta(days=30)).released == []
    assert Claim.objects.filter(pk=claim.pk).exists()


def test_with_release_it_goes_after_the_grace_through_the_delete_path_and_the_owner_is_told(settings, mail, owner):
    settings.GPUFLEET_RELEASE_IDLE = True
    settings.GPUFLEET_IDLE_GRACE_HOURS = 24
    claim = idle_claim(settings, owner)
    told = timezone.now()
    assert idle.run(now=told).warned == ["train on alpha"]
    assert f"It will be released at {told + timedelta(hours=24):%Y-%m-%d %H:%M} UTC unless one of its GPUs does work" \
        in mail.text(0)
    assert idle.run(now=told + timedelta(hours=23, minutes=59)).released == []

    assert idle.run(now=told + timedelta(hours=24)).released == ["train on alpha"]
    assert not Claim.objects.filter(pk=claim.pk).exists()
    assert Node.objects.get(name="alpha").gpus_reserved == 0
    entry = AuditEntry.objects.get(action="claim.delete")
    assert (entry.user, entry.target, str(entry).split()[2]) == (None, "train", "system")
    released = Event.objects.get(kind=Kind.CLAIM_RELEASED)
    assert released.message == "Claim 'train' released by the system, as it stayed idle after its owner was told"
    assert mail.subjects()[1] == "gpufleet: your idle claim train on alpha was released"
    assert "none did in the 24.0 hours after you were told" in mail.text(1)
    assert f"{SITE}/nodes/alpha/" in mail.text(1)


def test_a_claim_that_did_work_meanwhile_is_not_released(settings, mail, owner):
    settings.GPUFLEET_RELEASE_IDLE = True
    settings.GPUFLEET_IDLE_GRACE_HOURS = 1
    claim = idle_claim(settings, owner)
    idle.run()
    read = Claim.objects.select_related("node", "owner").get(pk=claim.pk)
    quiet("alpha", 2, claim.node.collected_at + STEP, busy=True)  # work, after the beat read it
    assert idle.release(read, timezone.now() + timedelta(hours=2)) is False
    assert Claim.objects.filter(pk=claim.pk).exists()


def test_with_no_mail_server_the_owner_is_told_through_the_event_alone(settings, owner):
    settings.EMAIL_HOST = ""
    claim = idle_claim(settings, owner)
    assert idle.run().warned == ["train on alpha"]
    assert Event.objects.filter(kind=Kind.CLAIM_IDLE, claim_name="train").exists()
    assert Claim.objects.get(pk=claim.pk).idle_warned_at is not None


def test_an_owner_without_an_address_is_told_through_the_event_alone(settings, mail, operator):
    idle_claim(settings, operator)
    assert idle.run().warned == ["train on alpha"]
    assert mail.messages == [] and Event.objects.filter(kind=Kind.CLAIM_IDLE).exists()


def test_the_task_is_on_the_central_beat():
    from django.conf import settings as live

    entry = next(e for e in live.CELERY_BEAT_SCHEDULE.values() if e["task"] == "gpufleet.usage.tasks.idle_claims")
    assert entry["schedule"] == live.GPUFLEET_COLLECT_INTERVAL
    assert live.CELERY_TASK_DEFAULT_QUEUE == "housekeeping"


def _report(at: datetime, gpus: int = 4, trainer_on: tuple[int, ...] = ()) -> None:
    """A snapshot of alpha taken `at`: its GPUs quiet, but those in `trainer_on` busy with a
    container labelled for the claim "train"."""
    snap = snapshot("alpha", gpus, at=at, util="0")
    for index in trainer_on:
        snap["devices"][index]["utilization_percent"] = 95
        snap["devices"][index]["processes"] = [{"pid": 4000 + index, "name": "python3", "used_mib": 30720, "container": {
            "id": f"{index:064x}", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": "train"}}]
    assert ingest_snapshot(snap).outcome == "accepted"


def _claim(name: str, count: int, at: datetime, owner) -> Claim:
    with time_machine.travel(at, tick=False):
        return services.save_claim(Node.objects.get(name="alpha"), gpu.Claim(name, count=count), owner)


def _beat(at: datetime) -> idle.Outcome:
    with time_machine.travel(at, tick=False):
        return idle.run()


def test_a_claim_made_on_long_idle_gpus_is_idle_from_when_it_was_made(settings, mail, owner):
    settings.GPUFLEET_COLLECT_INTERVAL, settings.GPUFLEET_IDLE_HOURS = int(STEP.total_seconds()), 1.0
    made = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    start = made - timedelta(hours=2)  # the GPUs did nothing for two hours before the claim
    for k in range(25):
        _report(start + k * STEP, gpus=2)
    claim = _claim("train", 2, made, owner)
    _report(made + timedelta(seconds=40), gpus=2)
    assert _beat(made + timedelta(seconds=45)).warned == []  # 40 s old: not idle for an hour
    assert Claim.objects.get(pk=claim.pk).idle_since is None

    at = made + STEP
    while at <= made + timedelta(hours=1):
        _report(at, gpus=2)
        at += STEP
    assert Claim.objects.get(pk=claim.pk).idle_since == made
    assert _beat(at).warned == ["train on alpha"]
    event = Event.objects.get(kind=Kind.CLAIM_IDLE)
    assert f"has done no work since {made:%Y-%m-%d %H:%M} UTC" in event.message
    assert f"has done no work since {made:%Y-%m-%d %H:%M} UTC" in mail.text(0)


def test_a_count_claim_beside_another_claim_s_busy_gpus_is_told_it_is_idle(settings, mail, owner):
    settings.GPUFLEET_COLLECT_INTERVAL, settings.GPUFLEET_IDLE_HOURS = int(STEP.total_seconds()), 1.0
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    _report(start)
    # "quiet" (older) runs nothing; "train" runs its labelled containers on three GPUs.
    _claim("quiet", 1, start, owner)
    _claim("train", 2, start + timedelta(seconds=1), owner)
    at = start + STEP
    while at <= start + timedelta(minutes=90):
        _report(at, trainer_on=(0, 1, 2))
        at += STEP
    assert _beat(at).warned == ["quiet on alpha"]
    assert "Claim 'quiet' (1 GPU) on alpha has done no work since" in Event.objects.get(kind=Kind.CLAIM_IDLE).message
    usage = report(start, at, "claim", {}).rows
    efficiency = {row.key["claim"]: row.efficiency for row in usage if row.key["claim"]}
    assert efficiency["quiet"] == 0 and efficiency["train"] == 1
