"""Two teams share a node as a lab would, in headless Chromium: a member of vision books
next Tuesday from the node's calendar, a member of nlp asking for the same GPU then is
refused with vision's booking named, and vision's calendar feed lists the booking."""

from __future__ import annotations

from datetime import UTC, timedelta
from urllib.parse import urlencode

import icalendar
import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.teams.models import Team
from tests.browser.conftest import log_in
from tests.claims.helpers import make_node, uuid

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _member(django_user_model, username: str, team: Team):
    """A person with the viewer role only: being in a team is what lets them book."""
    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    user.groups.add(Group.objects.get(name="viewer"))
    team.memberships.create(user=user)
    return user


def _next_tuesday_at_nine():
    now = timezone.localtime()
    days = (1 - now.weekday()) % 7 or 7
    return (now + timedelta(days=days)).replace(hour=9, minute=0, second=0, microsecond=0)


def _local_input(moment) -> str:
    return timezone.localtime(moment).strftime("%Y-%m-%dT%H:%M")


def _session(browser, live_server, user):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=live_server.url)
    context.set_default_timeout(10_000)
    return context, log_in(context.new_page(), user)


def test_a_team_books_next_tuesday_from_the_calendar_and_another_team_is_refused_with_it_named(
        browser, live_server, artifacts, django_user_model):
    node = make_node("alpha", 2)
    vision, nlp = Team.objects.create(name="vision"), Team.objects.create(name="nlp")
    vic, nick = _member(django_user_model, "vic", vision), _member(django_user_model, "nick", nlp)
    tuesday = _next_tuesday_at_nine()
    # nlp holds GPU 0 until Tuesday 09:00: the calendar's next free span of GPU 0 starts then.
    services.save_claim(node, gpu.Claim("warmup", device_ids=(uuid(node, 0),)), nick,
                        terms=services.Terms(owner=nick, team=nlp, ends_at=tuesday))

    # vision's member books from the calendar: the free span fills in GPU 0 and the start.
    context, page = _session(browser, live_server, vic)
    page.goto("/nodes/alpha/")
    calendar = page.locator("#node-calendar")
    expect(calendar.locator("tr", has_text="GPU 0").locator("td.calendar-held")).to_contain_text("warmup")
    calendar.locator("tr", has_text="GPU 0").locator("td.calendar-free a").first.click()
    form = page.locator("#claim-form")
    expect(form.locator(f'input[value="{uuid(node, 0)}"]')).to_be_checked()
    expect(form.get_by_label("Starts")).to_have_value(_local_input(tuesday))
    form.get_by_label("Name").fill("train-llm")
    form.get_by_label("Ends").fill(_local_input(tuesday + timedelta(hours=8)))
    form.get_by_role("button", name="Add claim").click()
    expect(page.locator(".claims-notice")).to_contain_text("Claim train-llm added")
    expect(calendar.locator("tr", has_text="GPU 0").locator("td.calendar-held").last).to_contain_text("train-llm")
    page.screenshot(path=str(artifacts / "team-booking-calendar.png"), full_page=True)
    booked = Claim.objects.get(name="train-llm")
    assert (booked.team, booked.owner, booked.device_ids) == (vision, vic, [uuid(node, 0)])
    assert (booked.starts_at, booked.ends_at) == (tuesday, tuesday + timedelta(hours=8))

    # vision's calendar feed lists the booking: its URL from the API, read with no login.
    feeds = page.request.get("/api/calendar/").json()["feeds"]
    team_feed = next(feed["url"] for feed in feeds if feed["kind"] == "team" and feed["name"] == "vision")
    context.close()
    anonymous = browser.new_context(base_url=live_server.url)
    answer = anonymous.request.get(team_feed)
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/calendar")
    events = icalendar.Calendar.from_ical(answer.body()).walk("VEVENT")
    assert [str(event["summary"]).split(" on ")[0] for event in events] == ["train-llm"]
    assert events[0].decoded("dtstart") == tuesday.astimezone(UTC)
    anonymous.close()

    # nlp's member asks for GPU 0 on Tuesday 10:00-12:00: refused, vision's booking named.
    context, page = _session(browser, live_server, nick)
    window = {"devices": uuid(node, 0), "starts_at": (tuesday + timedelta(hours=1)).isoformat(),
              "ends_at": (tuesday + timedelta(hours=3)).isoformat()}
    page.goto(f"/claims/nodes/alpha/new/?{urlencode(window)}")
    page.get_by_label("Name").fill("eval")
    page.get_by_role("button", name="Add claim").click()
    expect(page.locator("#id_devices_error")).to_contain_text("is already reserved by train-llm (team vision)")
    page.screenshot(path=str(artifacts / "team-booking-refused.png"), full_page=True)
    assert not Claim.objects.filter(name="eval").exists()
    context.close()
