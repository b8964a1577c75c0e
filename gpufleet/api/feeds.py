"""Calendar feeds (docs/claims.md#calendar-feeds): a private iCalendar URL per person (the
claims they own) and per team (the team's claims) that Outlook, Google Calendar and
Thunderbird subscribe to, one event per claim. The feed needs no login: the secret in
its URL is the credential (gpufleet.api.models.CalendarFeed). `GET /api/calendar/` and
the "API tokens" page tell a person their feeds' URLs, issuing each on its first ask."""

# No `from __future__ import annotations`, as in gpufleet/api/alerts.py.
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import icalendar
from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import IntegrityError
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_safe
from ninja import Field, Router

from gpufleet.api.errors import errors
from gpufleet.api.models import CalendarFeed
from gpufleet.api.schemas import Out
from gpufleet.claims.models import Claim, with_current_devices
from gpufleet.core.access import MANAGE_USERS, can
from gpufleet.teams.models import Membership, Team

# A feed holds the claims that ended within the last PAST_DAYS and every one not ended.
PAST_DAYS = 30
# An open-ended claim has no end to show: its event ends this long after the later of its
# start and the feed's reading, on the hour, so it always reaches past the next refresh.
OPEN_END_SHOWN = timedelta(days=1)
# How often a client is asked to read the feed again (clients may read less often).
REFRESH = timedelta(hours=1)
PRODID = "-//gpufleet//Calendar feed//EN"

router = Router()


# --- the feed --------------------------------------------------------------------------


@login_not_required
@require_safe
def feed(request: HttpRequest, secret: str) -> HttpResponse:
    """The feed of the secret in the URL. An unknown or revoked secret is a plain 404
    that tells neither apart."""
    found = CalendarFeed.find(secret)
    if found is None:
        return HttpResponseNotFound("There is no such calendar feed.\n", content_type="text/plain; charset=utf-8")
    now = timezone.now()
    response = HttpResponse(calendar(found, claims_of(found, now), now), content_type="text/calendar; charset=utf-8")
    # The URL is a credential: no shared cache keeps what it answers.
    response["Cache-Control"] = "private, no-cache"
    return response


def claims_of(feed: CalendarFeed, now: datetime) -> list[Claim]:
    """The feed's claims, in three queries at most whatever their number."""
    claims = Claim.objects.filter(team=feed.team_id) if feed.team_id else Claim.objects.filter(owner=feed.user_id)
    recent = Q(ends_at__isnull=True) | Q(ends_at__gt=now - timedelta(days=PAST_DAYS))
    found = list(claims.filter(recent).select_related("node", "team", "owner").order_by("starts_at", "pk"))
    with_current_devices(found)
    return found


def calendar(feed: CalendarFeed, claims: list[Claim], now: datetime) -> bytes:
    """The iCalendar text (RFC 5545) of `claims`, every time in UTC; the icalendar library
    writes and escapes it."""
    cal = icalendar.Calendar()
    cal.add("prodid", PRODID)
    cal.add("version", "2.0")
    cal.add("calscale", "GREGORIAN")
    cal.add("method", "PUBLISH")
    cal.add("x-wr-calname", f"GPU claims: {feed.subject()}")
    cal.add("refresh-interval", REFRESH, parameters={"VALUE": "DURATION"})
    cal.add("x-published-ttl", icalendar.vDuration(REFRESH))
    host = urlsplit(settings.GPUFLEET_SITE_URL).hostname or "gpufleet"
    for claim in claims:
        cal.add_component(event(claim, now, host))
    return cal.to_ical()


def event(claim: Claim, now: datetime, host: str) -> icalendar.Event:
    node_url = settings.GPUFLEET_SITE_URL.rstrip("/") + reverse("fleet:node_detail", args=[claim.node.name])
    ends_at = claim.ends_at or open_end(claim, now)
    description = [
        f"Team: {claim.team.name if claim.team_id else 'none'}",
        f"Owner: {claim.owner.get_username() if claim.owner_id else 'nobody'}",
        f"Contact: {claim.contact or 'none given'}",
    ]
    if claim.ends_at is None:
        description.append("No end set: the claim holds its GPUs until it is released.")
    description.append(f"Node: {node_url}")
    item = icalendar.Event()
    # Stable per claim, so a client updates the event in place when the claim changes.
    item.add("uid", f"claim-{claim.pk}@{host}")
    item.add("dtstamp", _utc(now))
    item.add("dtstart", _utc(claim.starts_at))
    item.add("dtend", _utc(ends_at))
    item.add("summary", str(claim) + (" (no end set)" if claim.ends_at is None else ""))
    item.add("location", claim.node.name)
    item.add("description", "\n".join(description))
    item.add("url", node_url)
    item.add("last-modified", _utc(claim.updated_at))
    # Grows with every change of the claim (seconds from its creation to its last change).
    item.add("sequence", max(0, int((claim.updated_at - claim.created_at).total_seconds())))
    item.add("status", "CONFIRMED")
    # GPUs booked do not make their owner busy: the event leaves free/busy times alone.
    item.add("transp", "TRANSPARENT")
    return item


def open_end(claim: Claim, now: datetime) -> datetime:
    """Where an open-ended claim's event is shown to end (see OPEN_END_SHOWN)."""
    later = max(claim.starts_at, now)
    return later.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1) + OPEN_END_SHOWN


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


# --- who has which feed ----------------------------------------------------------------


def feeds_for(user) -> list[CalendarFeed]:
    """The person's own feed, then each of their teams' by name: the latest of each, live
    or revoked. One never issued is issued now, so a first ask answers a URL; a revoked
    one stays revoked until someone re-issues it."""
    teams = list(Team.objects.filter(memberships__user=user))
    latest: dict[tuple, CalendarFeed] = {}
    for found in CalendarFeed.objects.select_related("user", "team").filter(Q(user=user) | Q(team__in=teams)):
        latest.setdefault((found.user_id, found.team_id), found)
    subjects = [((user.pk, None), {"user": user})] + [((None, team.pk), {"team": team}) for team in teams]
    return [latest.get(key) or _first(user, subject) for key, subject in subjects]


def _first(by, subject: dict) -> CalendarFeed:
    try:
        return CalendarFeed.issue(by, **subject)
    except IntegrityError:
        # Another first ask (a team mate's, say) issued it meanwhile.
        return CalendarFeed.objects.select_related("user", "team").get(revoked_at__isnull=True, **subject)


def may_revoke(user, feed: CalendarFeed) -> bool:
    """Who may revoke or re-issue a feed: a person their own; a team's, its leads and the
    admin role. The one place that says so, to give way to the claims' rights module."""
    if feed.user_id is not None:
        return feed.user_id == user.pk
    return can(user, MANAGE_USERS) or Membership.objects.filter(team=feed.team_id, user=user, lead=True).exists()


def may_see(user, feed: CalendarFeed) -> bool:
    """A person sees their own feed and their teams' feeds."""
    if feed.user_id is not None:
        return feed.user_id == user.pk
    return Membership.objects.filter(team=feed.team_id, user=user).exists()


def feed_url(request: HttpRequest, feed: CalendarFeed) -> str | None:
    """The live feed's URL as the person reaches the site; None for a revoked one (or one
    issued under a SECRET_KEY the site no longer has)."""
    secret = feed.secret() if feed.live else None
    return request.build_absolute_uri(reverse("calendar_feed", args=[secret])) if secret else None


# --- the API -----------------------------------------------------------------------------


class FeedOut(Out):
    kind: str = Field(description="person: the claims you own; team: the team's claims",
                      json_schema_extra={"enum": ["person", "team"]})
    name: str = Field(description="your username, or the team's name")
    url: str | None = Field(description="the iCalendar URL to subscribe to; null while revoked")
    issued_at: str = Field(json_schema_extra={"format": "date-time"})
    revoked_at: str | None = Field(json_schema_extra={"format": "date-time"})
    may_revoke: bool = Field(description="whether you may revoke or re-issue it (on the API tokens page)")


class CalendarOut(Out):
    feeds: list[FeedOut]


def as_dict(request: HttpRequest, feed: CalendarFeed) -> dict:
    return {
        "kind": "team" if feed.team_id else "person",
        "name": feed.team.name if feed.team_id else feed.user.get_username(),
        "url": feed_url(request, feed),
        "issued_at": feed.created_at.isoformat(),
        "revoked_at": feed.revoked_at.isoformat() if feed.revoked_at else None,
        "may_revoke": may_revoke(request.user, feed),
    }


@router.api_operation(["GET", "HEAD"], "/calendar/", url_name="calendar",
                      response={200: CalendarOut, **errors(401, 403)}, exclude_unset=True)
def calendar_feeds(request: HttpRequest) -> dict:
    """Your calendar feeds' URLs: your own (the claims you own) and each of your teams'
    (the team's claims), each issued on its first ask. Subscribe to them in a calendar."""
    return {"feeds": [as_dict(request, feed) for feed in feeds_for(request.user)]}
