"""Reminders: the owner of a booking is told, by email from the central beat and on the
claims page, an hour before it starts and an hour before it ends; once each, and again
after a save moves the start or the end. The clock is moved, never slept."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from gpufleet.usage import reminders, tasks
from tests.claims.helpers import NOW, TUESDAY_9, TUESDAY_17, make_node
from tests.usage.owner_mail import SITE, owner_fixture  # noqa: F401 (the owner fixture)

pytestmark = pytest.mark.django_db

HOUR = timedelta(hours=1)


@pytest.fixture
def booking(settings, owner, monday) -> Claim:
    """Two GPUs of alpha booked on Monday for Tuesday 09:00-17:00; mail in Django's outbox."""
    settings.EMAIL_HOST, settings.DEFAULT_FROM_EMAIL = "mail.example.com", "gpufleet@example.com"
    settings.GPUFLEET_SITE_URL = SITE
    make_node("alpha", 4, at=NOW)
    return book(owner, TUESDAY_9, TUESDAY_17)


def book(owner, starts_at, ends_at, name: str = "lab", editing: Claim | None = None) -> Claim:
    return services.save_claim(Node.objects.get(name="alpha"), gpu.Claim(name, count=2), owner, editing=editing,
                               expected_updated_at=editing.updated_at if editing else None,
                               terms=services.Terms(owner=owner, starts_at=starts_at, ends_at=ends_at))


def beat(clock, at) -> reminders.Outcome:
    clock.move_to(at)
    return reminders.run()


def test_the_owner_is_told_an_hour_before_the_booking_starts_once(monday, booking, mailoutbox):
    assert beat(monday, TUESDAY_9 - HOUR - timedelta(seconds=1)) == reminders.Outcome()
    assert mailoutbox == []

    assert beat(monday, TUESDAY_9 - HOUR).starting == ["lab on alpha"]
    (message,) = mailoutbox
    assert message.to == ["otto@example.com"] and message.from_email == "gpufleet@example.com"
    assert message.subject == "gpufleet: your booking lab on alpha starts soon"
    assert message.body.startswith(
        "Your booking 'lab' (2 GPUs) on alpha starts soon: it holds its GPUs from Tue 8 Dec 09:00 to Tue 8 Dec"
        " 17:00 UTC.")
    assert f"{SITE}/nodes/alpha/#claim-{booking.pk}" in message.body
    assert "within 2 hours of its start" in message.body  # the no-show rule, said ahead
    assert Claim.objects.get(pk=booking.pk).start_reminded_at == TUESDAY_9 - HOUR

    # However often the beat runs, one reminder; none once it started.
    for at in (TUESDAY_9 - HOUR / 2, TUESDAY_9 - timedelta(seconds=1), TUESDAY_9, TUESDAY_9 + HOUR):
        assert beat(monday, at) == reminders.Outcome()
    assert len(mailoutbox) == 1


def test_the_owner_is_told_an_hour_before_it_ends_once(monday, booking, mailoutbox):
    beat(monday, TUESDAY_9 - HOUR)
    assert beat(monday, TUESDAY_17 - HOUR - timedelta(seconds=1)) == reminders.Outcome()
    assert beat(monday, TUESDAY_17 - HOUR).ending == ["lab on alpha"]
    assert mailoutbox[1].subject == "gpufleet: your claim lab on alpha ends soon"
    assert mailoutbox[1].body.startswith(
        "Your claim 'lab' (2 GPUs) on alpha ends soon: it holds its GPUs from Tue 8 Dec 09:00 to Tue 8 Dec 17:00 UTC,"
        " when they are free for others.")
    assert beat(monday, TUESDAY_17 - timedelta(minutes=1)) == reminders.Outcome()
    assert beat(monday, TUESDAY_17) == reminders.Outcome()
    assert len(mailoutbox) == 2


def test_a_moved_start_is_reminded_again_and_an_unmoved_end_is_not(monday, owner, booking, mailoutbox):
    beat(monday, TUESDAY_9 - HOUR)
    moved = book(owner, TUESDAY_9 + HOUR, TUESDAY_17, editing=booking)
    assert (moved.start_reminded_at, moved.end_reminded_at) == (None, None)
    assert beat(monday, TUESDAY_9 - HOUR / 2) == reminders.Outcome()  # 90 minutes before its new start
    assert beat(monday, TUESDAY_9).starting == ["lab on alpha"]
    assert len(mailoutbox) == 2

    # An end reminded, then moved later: reminded again an hour before the new end.
    assert beat(monday, TUESDAY_17 - HOUR).ending == ["lab on alpha"]
    later = book(owner, TUESDAY_9 + HOUR, TUESDAY_17 + HOUR, editing=Claim.objects.get(pk=booking.pk))
    assert later.start_reminded_at == TUESDAY_9 and later.end_reminded_at is None  # its start did not move
    assert beat(monday, TUESDAY_17 - HOUR / 2) == reminders.Outcome()
    assert beat(monday, TUESDAY_17).ending == ["lab on alpha"]
    assert len(mailoutbox) == 4


def test_a_claim_made_now_is_not_reminded_of_its_start(monday, owner, booking, mailoutbox):
    made_now = services.save_claim(Node.objects.get(name="alpha"), gpu.Claim("train", count=1), owner)
    assert beat(monday, NOW + timedelta(minutes=1)) == reminders.Outcome()
    assert Claim.objects.get(pk=made_now.pk).start_reminded_at is None and mailoutbox == []


def test_an_owner_with_no_address_is_reminded_on_the_site_alone(monday, operator_client, owner, booking, mailoutbox):
    owner.email = ""
    owner.save()
    assert beat(monday, TUESDAY_9 - HOUR).starting == ["lab on alpha"]
    assert mailoutbox == []
    assert "starts in 1 h" in _reminders_shown(operator_client)


def _reminders_shown(client) -> str:
    html = client.get("/claims/").content.decode()
    start = html.find('<section class="claims-soon"')
    return html[start:html.find("</section>", start)] if start >= 0 else ""


def test_the_claims_page_shows_its_owner_what_starts_or_ends_within_the_hour(
        monday, booking, operator_client, viewer_client):
    monday.move_to(TUESDAY_9 - HOUR - timedelta(minutes=1))
    assert _reminders_shown(operator_client) == ""

    monday.move_to(TUESDAY_9 - timedelta(minutes=40))
    shown = _reminders_shown(operator_client)
    assert "lab" in shown and "on alpha" in shown and "starts in 40 min" in shown
    assert f'href="/nodes/alpha/#claim-{booking.pk}"' in shown
    assert _reminders_shown(viewer_client) == ""  # another person's booking

    monday.move_to(TUESDAY_9 + HOUR)
    assert _reminders_shown(operator_client) == ""
    monday.move_to(TUESDAY_17 - timedelta(minutes=20))
    assert "20 min left" in _reminders_shown(operator_client)
    monday.move_to(TUESDAY_17)
    assert _reminders_shown(operator_client) == ""


def test_the_task_is_on_the_central_beat(monday, booking, mailoutbox):
    from django.conf import settings as live

    entry = next(e for e in live.CELERY_BEAT_SCHEDULE.values() if e["task"] == "gpufleet.usage.tasks.remind_owners")
    assert entry["schedule"] == 60.0
    monday.move_to(TUESDAY_9 - HOUR)
    assert tasks.remind_owners() == {"starting": ["lab on alpha"], "ending": []}
