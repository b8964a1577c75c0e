"""No-shows: a booking none of whose GPUs did any work within GPUFLEET_NO_SHOW_HOURS of
its start is flagged idle then by ingest (not after GPUFLEET_IDLE_HOURS), its owner told
by the idle claims' beat, and released GPUFLEET_IDLE_GRACE_HOURS later through the same
audited delete, whether or not GPUFLEET_RELEASE_IDLE is on. The clock is moved, snapshot
by snapshot, as a node reports."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event, Kind
from gpufleet.fleet.models import Node
from gpufleet.usage import idle
from tests.claims.helpers import NOW, TUESDAY_9, TUESDAY_17
from tests.usage.owner_mail import SITE, STEP, owner_fixture, quiet  # noqa: F401 (the owner fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def booking(settings, owner, monday, mailoutbox) -> Claim:
    """Both GPUs of alpha (quiet since Monday noon) booked on Monday for Tuesday 09:00-17:00;
    the idle rule a day, a no-show two hours, the grace one hour; mail in Django's outbox."""
    settings.GPUFLEET_COLLECT_INTERVAL = int(STEP.total_seconds())
    settings.GPUFLEET_IDLE_HOURS, settings.GPUFLEET_NO_SHOW_HOURS, settings.GPUFLEET_IDLE_GRACE_HOURS = 24, 2, 1
    settings.EMAIL_HOST, settings.DEFAULT_FROM_EMAIL = "mail.example.com", "gpufleet@example.com"
    settings.GPUFLEET_SITE_URL = SITE
    quiet("alpha", 2, NOW)
    return services.save_claim(Node.objects.get(name="alpha"), gpu.Claim("lab", count=2), owner,
                               terms=services.Terms(owner=owner, starts_at=TUESDAY_9, ends_at=TUESDAY_17))


def report_until(clock, start: datetime, end: datetime, busy_at: datetime | None = None) -> None:
    """alpha reports every five minutes from `start` to `end`, the clock moved to each
    snapshot; GPU 0 at work in the one taken at `busy_at`."""
    at = start
    while at <= end:
        clock.move_to(at)
        quiet("alpha", 2, at, busy=at == busy_at)
        at += STEP


def beat(clock, at: datetime) -> idle.Outcome:
    clock.move_to(at)
    return idle.run()


def test_a_booking_with_no_work_two_hours_after_its_start_is_warned_then_released(monday, booking, mailoutbox):
    report_until(monday, TUESDAY_9 - STEP, TUESDAY_9 + timedelta(hours=2) - STEP)
    assert Claim.objects.get(pk=booking.pk).idle_since is None  # not two hours yet
    assert beat(monday, TUESDAY_9 + timedelta(hours=2) - STEP) == idle.Outcome()

    report_until(monday, TUESDAY_9 + timedelta(hours=2), TUESDAY_9 + timedelta(hours=2))
    flagged = Claim.objects.get(pk=booking.pk)
    assert flagged.idle_since == TUESDAY_9 and flagged.no_show
    told = TUESDAY_9 + timedelta(hours=2)
    assert beat(monday, told).warned == ["lab on alpha"]
    (message,) = mailoutbox
    assert message.to == ["otto@example.com"]
    assert message.subject == "gpufleet: your booking lab on alpha was not used"
    assert message.body.startswith(
        "Booking 'lab' (2 GPUs) on alpha has done no work since it started at 2026-12-08 09:00 UTC: "
        "4.0 GPU-hours reserved and unused. It will be released at 2026-12-08 12:00 UTC unless one of its GPUs"
        " does work.")
    assert f"{SITE}/nodes/alpha/#claim-{booking.pk}" in message.body
    assert Event.objects.get(kind=Kind.CLAIM_IDLE).message in message.body
    assert beat(monday, told + timedelta(minutes=30)) == idle.Outcome()  # told once

    # Released after the grace, GPUFLEET_RELEASE_IDLE being off, as an idle claim is.
    report_until(monday, told + STEP, told + timedelta(hours=1) - STEP)
    assert beat(monday, told + timedelta(hours=1) - STEP).released == []
    assert beat(monday, told + timedelta(hours=1)).released == ["lab on alpha"]
    assert not Claim.objects.filter(pk=booking.pk).exists()
    entry = AuditEntry.objects.get(action="claim.delete")
    assert (entry.user, entry.target, entry.before["starts_at"]) == (None, "lab", TUESDAY_9.isoformat())
    released = Event.objects.get(kind=Kind.CLAIM_RELEASED)
    assert released.message == "Claim 'lab' released by the system, as it stayed idle after its owner was told"
    assert mailoutbox[1].subject == "gpufleet: your idle claim lab on alpha was released"


def test_a_booking_whose_gpu_did_work_after_its_start_is_no_no_show(monday, booking, mailoutbox):
    report_until(monday, TUESDAY_9 - STEP, TUESDAY_9 + timedelta(hours=3), busy_at=TUESDAY_9 + timedelta(minutes=30))
    assert Claim.objects.get(pk=booking.pk).idle_since is None  # judged by the idle rule's day from its work
    assert beat(monday, TUESDAY_9 + timedelta(hours=3)) == idle.Outcome()
    assert mailoutbox == []


def test_a_claim_made_at_its_start_waits_for_the_idle_rule(monday, booking, owner):
    monday.move_to(TUESDAY_9)
    node = Node.objects.get(name="alpha")
    Claim.objects.filter(pk=booking.pk).delete()
    made_now = services.save_claim(node, gpu.Claim("train", count=2), owner)
    assert not made_now.made_ahead
    report_until(monday, TUESDAY_9 + STEP, TUESDAY_9 + timedelta(hours=3))
    assert Claim.objects.get(pk=made_now.pk).idle_since is None


def test_no_show_hours_of_zero_leaves_bookings_to_the_idle_rule(settings, monday, booking):
    settings.GPUFLEET_NO_SHOW_HOURS = 0
    report_until(monday, TUESDAY_9 - STEP, TUESDAY_9 + timedelta(hours=3))
    assert Claim.objects.get(pk=booking.pk).idle_since is None


def test_a_no_show_flagged_by_a_shorter_idle_rule_is_still_released_without_release_idle(settings, monday, booking):
    """With the idle rule under the no-show hours the booking is flagged by it first; being
    idle from its start, it is a no-show all the same."""
    settings.GPUFLEET_IDLE_HOURS = 1
    report_until(monday, TUESDAY_9 - STEP, TUESDAY_9 + timedelta(hours=1))
    assert Claim.objects.get(pk=booking.pk).no_show
    assert beat(monday, TUESDAY_9 + timedelta(hours=1)).warned == ["lab on alpha"]
    assert beat(monday, TUESDAY_9 + timedelta(hours=2)).released == ["lab on alpha"]


def test_an_idle_claim_that_is_no_booking_is_still_kept_without_release_idle(settings, monday, owner):
    """GPUFLEET_RELEASE_IDLE still decides for claims that are not no-shows."""
    settings.GPUFLEET_COLLECT_INTERVAL, settings.GPUFLEET_IDLE_HOURS, settings.GPUFLEET_IDLE_GRACE_HOURS = 300, 1, 1
    quiet("alpha", 2, NOW)
    claim = services.save_claim(Node.objects.get(name="alpha"), gpu.Claim("train", count=2), owner)
    report_until(monday, NOW + STEP, NOW + timedelta(hours=1))
    assert Claim.objects.get(pk=claim.pk).idle_since == NOW and not Claim.objects.get(pk=claim.pk).no_show
    assert beat(monday, NOW + timedelta(hours=1)).warned == ["train on alpha"]
    assert beat(monday, NOW + timedelta(hours=3)).released == []


def test_the_claims_list_shows_a_no_show(monday, booking, viewer_client):
    report_until(monday, TUESDAY_9 - STEP, TUESDAY_9 + timedelta(hours=2))
    assert "no-show: idle since" in viewer_client.get("/claims/").content.decode()
