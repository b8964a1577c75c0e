"""Calendar feeds: a private iCalendar URL per person (the claims they own) and per team
(the team's claims), read without a login, its secret stored only as a digest; the
events parsed back with the icalendar library as a calendar client would."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import icalendar
import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, override_settings

from gpufleet import gpu
from gpufleet.api import feeds
from gpufleet.api.models import ApiToken, CalendarFeed
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.teams.models import Team
from tests.claims.helpers import NOW, TUESDAY_9, TUESDAY_17, lab_team, make_node, uuid

pytestmark = pytest.mark.django_db

SITE = "https://gpus.example.org"


@pytest.fixture(autouse=True)
def _site(settings):
    settings.GPUFLEET_SITE_URL = SITE


def book(node, name, owner, starts_at=TUESDAY_9, ends_at=TUESDAY_17, team=None, count=1, device_ids=(),
         contact="#vision") -> Claim:
    """Saved by the system for `team` (None: lab), owned by `owner`: who may book is not
    what these tests are about (tests/claims/test_rights.py)."""
    terms = services.Terms(owner=owner, contact=contact, starts_at=starts_at, ends_at=ends_at, team=team or lab_team())
    return services.save_claim(node, gpu.Claim(name=name, count=count, device_ids=tuple(device_ids)), None, terms=terms)


def url_path(feed: CalendarFeed) -> str:
    return f"/calendar/{feed.secret()}.ics"


def read(feed: CalendarFeed, client=None) -> icalendar.Calendar:
    response = (client or Client()).get(url_path(feed))
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "text/calendar; charset=utf-8"
    return icalendar.Calendar.from_ical(response.content)


def by_uid(cal: icalendar.Calendar) -> dict[str, icalendar.Event]:
    return {str(event["UID"]): event for event in cal.events}


@pytest.fixture
def vision(operator, viewer):
    team = Team.objects.create(name="vision")
    team.memberships.create(user=operator, lead=True)
    team.memberships.create(user=viewer)
    return team


def test_a_person_s_feed_is_an_icalendar_clients_accept_with_an_event_per_claim(monday, operator, vision):
    node = make_node("alpha")
    booked = book(node, "train-llm", operator, team=vision, count=2)
    feed = CalendarFeed.issue(operator, user=operator)
    cal = read(feed)  # a client with no session: no login needed
    assert (str(cal["VERSION"]), str(cal["CALSCALE"]), str(cal["METHOD"])) == ("2.0", "GREGORIAN", "PUBLISH")
    assert str(cal["PRODID"]) == feeds.PRODID
    assert str(cal["X-WR-CALNAME"]) == "GPU claims: otto"
    [event] = cal.events
    assert str(event["UID"]) == f"claim-{booked.pk}@gpus.example.org"
    assert event.decoded("DTSTART") == TUESDAY_9 and event.decoded("DTEND") == TUESDAY_17
    # Written in UTC ("Z"), so a client needs no VTIMEZONE.
    assert (event["DTSTART"].to_ical(), event["DTEND"].to_ical()) == (b"20261208T090000Z", b"20261208T170000Z")
    assert str(event["SUMMARY"]) == "train-llm on alpha: 2 GPUs"
    assert str(event["LOCATION"]) == "alpha"
    description = str(event["DESCRIPTION"]).splitlines()
    assert description == ["Team: vision", "Owner: otto", "Contact: #vision", f"Node: {SITE}/nodes/alpha/"]
    assert str(event["URL"]) == f"{SITE}/nodes/alpha/"
    assert event.decoded("LAST-MODIFIED") == booked.updated_at
    assert int(event["SEQUENCE"]) == 0
    assert str(event["TRANSP"]) == "TRANSPARENT"


def test_an_open_ended_claim_is_shown_ending_a_day_past_the_next_hour(monday, operator):
    node = make_node("alpha")
    book(node, "notebook", operator, starts_at=None, ends_at=None)
    monday.shift(timedelta(minutes=20))
    [event] = read(CalendarFeed.issue(operator, user=operator)).events
    assert event.decoded("DTSTART") == NOW
    assert event.decoded("DTEND") == NOW + timedelta(hours=1, days=1)
    assert str(event["SUMMARY"]).endswith("(no end set)")
    assert "No end set: the claim holds its GPUs until it is released." in str(event["DESCRIPTION"])


def test_a_changed_claim_keeps_its_uid_and_raises_its_sequence(monday, operator):
    node = make_node("alpha")
    booked = book(node, "train", operator)
    feed = CalendarFeed.issue(operator, user=operator)
    [before] = read(feed).events
    monday.shift(timedelta(minutes=5))
    terms = services.Terms(owner=operator, contact="", starts_at=TUESDAY_9, ends_at=TUESDAY_17 + timedelta(hours=2))
    services.save_claim(node, gpu.Claim(name="train", count=1), operator, editing=booked,
                        expected_updated_at=booked.updated_at, terms=terms)
    [after] = read(feed).events
    assert str(after["UID"]) == str(before["UID"])
    assert int(after["SEQUENCE"]) > int(before["SEQUENCE"])
    assert after.decoded("DTEND") == TUESDAY_17 + timedelta(hours=2)


@pytest.mark.parametrize("evil", [
    "x\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nUID:forged\r\nSUMMARY:forged",
    "a,b;c\\d\nBEGIN:VEVENT",
    "BEGIN:VEVENT",
])
def test_text_in_a_claim_cannot_add_an_event(monday, operator, evil):
    node = make_node("alpha")
    booked = book(node, "train", operator)
    # Stored as it comes, past the forms' checks: the feed must hold whatever a row holds.
    Claim.objects.filter(pk=booked.pk).update(name=evil, contact=evil)
    cal = read(CalendarFeed.issue(operator, user=operator))
    [event] = cal.events
    assert str(event["SUMMARY"]) == f"{evil} on alpha: 1 GPU".replace("\r\n", "\n")
    assert f"Contact: {evil}".replace("\r\n", "\n") in str(event["DESCRIPTION"])
    assert str(event["UID"]) == f"claim-{booked.pk}@gpus.example.org"


def test_my_feed_holds_the_claims_i_own_and_no_one_else_s(monday, operator, viewer):
    node = make_node("alpha")
    mine = book(node, "mine", operator)
    book(node, "theirs", viewer)
    assert list(by_uid(read(CalendarFeed.issue(operator, user=operator)))) == [f"claim-{mine.pk}@gpus.example.org"]


def test_a_team_feed_holds_the_team_s_claims_whoever_owns_them(monday, operator, viewer, admin_user, vision):
    other = Team.objects.create(name="audio")
    node = make_node("alpha")
    lead_s = book(node, "lead-s", operator, team=vision)
    member_s = book(node, "member-s", viewer, team=vision)
    book(node, "audio-s", admin_user, team=other)
    cal = read(CalendarFeed.issue(viewer, team=vision))
    assert str(cal["X-WR-CALNAME"]) == "GPU claims: team vision"
    assert set(by_uid(cal)) == {f"claim-{c.pk}@gpus.example.org" for c in (lead_s, member_s)}


def test_claims_ended_more_than_past_days_ago_are_left_out(monday, operator):
    node = make_node("alpha")
    recent = book(node, "recent", operator)
    old = book(node, "old", operator, starts_at=TUESDAY_9 + timedelta(days=2), ends_at=TUESDAY_17 + timedelta(days=2))
    Claim.objects.filter(pk=recent.pk).update(starts_at=NOW - timedelta(days=3), ends_at=NOW - timedelta(days=2))
    Claim.objects.filter(pk=old.pk).update(starts_at=NOW - timedelta(days=feeds.PAST_DAYS + 2),
                                           ends_at=NOW - timedelta(days=feeds.PAST_DAYS + 1))
    assert list(by_uid(read(CalendarFeed.issue(operator, user=operator)))) == [f"claim-{recent.pk}@gpus.example.org"]


@pytest.mark.parametrize("revoke", ["revoked", "unknown", "deactivated"])
def test_a_revoked_or_unknown_secret_is_a_404_that_tells_nothing(monday, operator, revoke):
    feed = CalendarFeed.issue(operator, user=operator)
    path = url_path(feed)
    if revoke == "revoked":
        feed.revoke(operator)
    elif revoke == "unknown":
        path = "/calendar/" + "0" * 64 + ".ics"
    else:
        operator.is_active = False
        operator.save()
    response = Client().get(path)
    assert response.status_code == 404
    assert response.content == b"There is no such calendar feed.\n"


def test_only_a_digest_of_the_secret_is_stored_and_the_url_survives_a_key_rotation(operator, settings):
    feed = CalendarFeed.issue(operator, user=operator)
    secret = feed.secret()
    assert len(secret) == 64
    stored = [str(value) for value in CalendarFeed.objects.values().get().values()]
    assert secret not in stored
    assert feed.digest == hashlib.sha256(secret.encode()).hexdigest()
    old_key = settings.SECRET_KEY
    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "a-new-key-" + "x" * 50, [old_key]
    assert feed.secret() == secret
    assert Client().get(f"/calendar/{secret}.ics").status_code == 200
    settings.SECRET_KEY_FALLBACKS = []
    assert feed.secret() is None  # the page offers to re-issue it
    assert Client().get(f"/calendar/{secret}.ics").status_code == 200  # subscribers keep reading


def test_a_feed_is_read_in_the_same_number_of_queries_for_1_claim_as_for_50(monday, operator, vision):
    node = make_node("alpha")
    feed = CalendarFeed.issue(operator, team=vision)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            read(feed)
        return len(captured)

    book(node, "pinned-0", operator, team=vision, count=0, device_ids=[uuid(node, 0)])
    one = queries()
    for i in range(1, 50):
        book(node, f"train-{i}", operator, team=vision, starts_at=TUESDAY_9 + timedelta(days=i),
             ends_at=TUESDAY_17 + timedelta(days=i), device_ids=[uuid(node, i % 8)], count=0)
    assert len(read(feed).events) == 50
    assert queries() == one <= 3


# --- GET /api/calendar/ -------------------------------------------------------------


def test_the_api_issues_my_feeds_on_the_first_ask_and_answers_the_same_urls_after(monday, operator, vision):
    client = Client()
    client.force_login(operator)
    first = client.get("/api/calendar/")
    assert first.status_code == 200, first.content
    answered = first.json()["feeds"]
    assert [(f["kind"], f["name"], f["may_revoke"], f["revoked_at"]) for f in answered] == [
        ("person", "otto", True, None), ("team", "lab", False, None), ("team", "vision", True, None)]
    assert all(f["url"].startswith("http://testserver/calendar/") for f in answered)
    assert sorted(AuditEntry.objects.values_list("action", "target")) == [
        ("feed.create", "calendar feed of otto"), ("feed.create", "calendar feed of team lab"),
        ("feed.create", "calendar feed of team vision")]
    assert client.get("/api/calendar/").json()["feeds"] == answered
    assert CalendarFeed.objects.count() == 3
    path = answered[2]["url"].removeprefix("http://testserver")
    assert Client().get(path).status_code == 200


def test_a_team_member_reads_the_team_feed_s_url_that_the_lead_made(monday, operator, viewer, vision):
    _, secret = ApiToken.issue(viewer, "cal", "read")
    lead = Client()
    lead.force_login(operator)
    lead_urls = {f["name"]: f["url"] for f in lead.get("/api/calendar/").json()["feeds"]}
    member = Client(headers={"authorization": f"Bearer {secret}"})
    answered = member.get("/api/calendar/").json()["feeds"]
    assert [(f["name"], f["may_revoke"]) for f in answered] == [("vera", True), ("vision", False)]
    assert answered[1]["url"] == lead_urls["vision"]
    assert answered[0]["url"] != lead_urls["otto"]


def test_the_api_needs_a_login_and_a_role(client, outsider):
    assert client.get("/api/calendar/").status_code == 401
    refused = Client()
    refused.force_login(outsider)
    assert refused.get("/api/calendar/").status_code == 403
    assert not CalendarFeed.objects.exists()


# --- the page -----------------------------------------------------------------------


def test_the_tokens_page_shows_my_feeds_with_copyable_urls(operator_client, operator, vision):
    response = operator_client.get("/tokens/")
    page = response.content.decode()
    assert "Calendar feeds" in page
    for feed in CalendarFeed.objects.all():
        assert f'<code id="feed-url-{feed.pk}">http://testserver{url_path(feed)}</code>' in page
        assert f'data-copy="feed-url-{feed.pk}"' in page


def test_revoking_my_feed_ends_its_url_audited_and_it_stays_revoked(operator_client, operator):
    operator_client.get("/tokens/")
    feed = CalendarFeed.objects.get(user=operator)
    path = url_path(feed)
    response = operator_client.post(f"/tokens/calendar/{feed.pk}/revoke/")
    assert response.status_code == 302 and response["Location"] == "/tokens/"
    assert Client().get(path).status_code == 404
    entry = AuditEntry.objects.get(action="feed.revoke")
    assert (entry.user, entry.target, entry.before) == (operator, "calendar feed of otto", {"user": "otto"})
    page = operator_client.get("/tokens/").content.decode()
    assert CalendarFeed.objects.filter(user=operator).count() == 1  # not issued again by looking
    assert "Issue a new URL" in page and path not in page


def test_re_issuing_gives_a_new_url_and_ends_the_old(operator_client, operator):
    operator_client.get("/tokens/")
    feed = CalendarFeed.objects.get(user=operator)
    old = url_path(feed)
    assert operator_client.post(f"/tokens/calendar/{feed.pk}/reissue/").status_code == 302
    new = CalendarFeed.objects.get(user=operator, revoked_at__isnull=True)
    assert new.pk != feed.pk
    assert Client().get(old).status_code == 404
    assert Client().get(url_path(new)).status_code == 200
    assert [e.action for e in AuditEntry.objects.order_by("id")][-2:] == ["feed.revoke", "feed.create"]


def test_only_leads_and_admins_revoke_a_team_feed_and_strangers_do_not_find_it(
        viewer_client, operator_client, admin_role_client, vision, django_user_model):
    feed = CalendarFeed.issue(None, team=vision)
    assert viewer_client.post(f"/tokens/calendar/{feed.pk}/revoke/").status_code == 403
    stranger = django_user_model.objects.create_user("sam")
    stranger.groups.add(Group.objects.get(name="operator"))
    stranger_client = Client()
    stranger_client.force_login(stranger)
    assert stranger_client.post(f"/tokens/calendar/{feed.pk}/revoke/").status_code == 404
    feed.refresh_from_db()
    assert feed.live
    assert operator_client.post(f"/tokens/calendar/{feed.pk}/reissue/").status_code == 302  # the lead
    new = CalendarFeed.objects.get(team=vision, revoked_at__isnull=True)
    assert admin_role_client.post(f"/tokens/calendar/{new.pk}/revoke/").status_code == 302  # admin, no member
    assert not CalendarFeed.objects.filter(team=vision, revoked_at__isnull=True).exists()


def test_revoking_wants_a_post(operator_client, operator):
    feed = CalendarFeed.issue(operator, user=operator)
    assert operator_client.get(f"/tokens/calendar/{feed.pk}/revoke/").status_code == 405
    assert CalendarFeed.objects.get().live


@override_settings(CSRF_COOKIE_SECURE=False)
def test_revoking_wants_the_csrf_token(operator):
    feed = CalendarFeed.issue(operator, user=operator)
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert client.post(f"/tokens/calendar/{feed.pk}/revoke/").status_code == 403
    assert CalendarFeed.objects.get().live
