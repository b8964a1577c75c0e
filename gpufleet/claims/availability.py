"""When GPUs are free, from the stored nodes and their claims: a node's calendar, the
fleet's free GPUs per model per hour or day, and the earliest slots for N GPUs. The
answers are the domain's (gpufleet.gpu.availability); this reads what they need, the
fleet in a fixed number of queries whatever its size (as placement does).

The fleet's answers are kept (`kept_fleet_free`, `kept_fleet_slots`): computed at most once
per GPUFLEET_AVAILABILITY_MAX_AGE_S and shared by every view, as the overview's summary is,
and dropped when the site changes a claim, a maintenance window or a diagnostic."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.db.models.functions import Collate
from django.utils import timezone

from gpufleet.claims.models import Claim
from gpufleet.claims.placement import fleet_candidates, open_nodes
from gpufleet.fleet import summary_keep
from gpufleet.fleet.models import Device, Node
from gpufleet.gpu import availability

HORIZON_DAYS = 14
HOUR = timedelta(hours=1)
DAY = "day"
STEPS = ("hour", DAY)
# "Find a slot" lists this many nodes' earliest windows.
SLOTS_SHOWN = 20


def bar_label(row: Claim | None, name: str) -> str:
    """What a calendar bar says of its claim: its name, its team where claims have one,
    and its owner."""
    if row is None:
        return name
    parts = [row.name]
    team = getattr(row, "team", None)
    if team:
        parts.append(str(team))
    if row.owner_id:
        parts.append(row.owner.get_username())
    return " · ".join(parts)


def calendar_start(now: datetime) -> datetime:
    """The hour `now` is in, in the site's time zone (a zone may be half an hour off UTC)."""
    return timezone.localtime(now).replace(minute=0, second=0, microsecond=0).astimezone(UTC)


@dataclass(frozen=True)
class Bar:
    """A run of a calendar line as a template draws it: `slots` hours wide."""

    slots: int
    state: str  # availability.HELD / FREE / FULL, or "" for a count claim's empty hours
    starts_at: datetime
    ends_at: datetime
    label: str = ""
    window: str = ""
    book_url: str = ""  # a free run's link to the claim form, filled in


@dataclass(frozen=True)
class Line:
    title: str
    detail: str
    uuid: str  # the GPU's, for "book it"; "" for a count claim's line
    bars: list[Bar]


@dataclass(frozen=True)
class Calendar:
    starts_at: datetime
    ends_at: datetime
    days: list[tuple[datetime, int]]  # each day shown (its first hour) and its hours
    lines: list[Line]

    @property
    def hours(self) -> int:
        return sum(hours for _, hours in self.days)


def node_calendar(node: Node, now: datetime | None = None) -> Calendar:
    """The node's GPUs hour by hour over the next HORIZON_DAYS, and its claims for a count
    of GPUs, each on a line. Three queries: its GPUs, its claims meeting the days with their owners and teams."""
    start = calendar_start(now or timezone.now())
    slots = HORIZON_DAYS * 24
    end = start + slots * HOUR
    rows = list(node.claims.overlapping(start, end).select_related("owner", "team"))
    by_name = {row.name: row for row in rows}
    ledger = node.ledger(claims=rows)

    def bar(run: availability.Run) -> Bar:
        if run.claim is None:
            return Bar(run.slots, run.state, run.starts_at, run.ends_at)
        return Bar(run.slots, run.state, run.starts_at, run.ends_at, bar_label(by_name.get(run.claim.name), run.claim.name),
                   run.claim.window())

    lines = [
        Line(f"GPU {lane.device.index}", lane.device.name, lane.device.uuid, [bar(r) for r in lane.runs])
        for lane in availability.lanes(ledger, start, HOUR, slots)
    ]
    for claim, runs in availability.count_lanes(ledger, start, HOUR, slots):
        gpus = f"{claim.count} GPU{'' if claim.count == 1 else 's'}"
        lines.append(Line(gpus, "any of the node's GPUs", "", [bar(r) for r in runs]))
    return Calendar(start, end, _days(start, slots), lines)


def _days(start: datetime, slots: int) -> list[tuple[datetime, int]]:
    days: list[tuple[datetime, int]] = []
    for i in range(slots):
        hour = start + i * HOUR
        if days and timezone.localdate(hour) == timezone.localdate(days[-1][0]):
            days[-1] = (days[-1][0], days[-1][1] + 1)
        else:
            days.append((hour, 1))
    return days


def bucket_edges(step: str, now: datetime) -> list[datetime]:
    """The buckets of the next HORIZON_DAYS: hours from the current one, or days from
    today's midnight, both in the site's time zone (a day may have 23 or 25 hours)."""
    if step == DAY:
        today = timezone.localdate(now)
        zone = timezone.get_current_timezone()
        return [datetime.combine(today + timedelta(days=i), datetime.min.time(), zone).astimezone(UTC)
                for i in range(HORIZON_DAYS + 1)]
    start = calendar_start(now)
    return [start + i * HOUR for i in range(HORIZON_DAYS * 24 + 1)]


def fleet_free(step: str, now: datetime | None = None) -> tuple[list[datetime], dict[str, list[int]]]:
    """The buckets and, per GPU model, how many GPUs of the nodes that take new work are
    free throughout each. Four queries, whatever the fleet size: the open nodes no claim
    meets are counted by model in SQL, as each of their GPUs is free throughout; only the
    others are read (nodes, GPUs, claims) for the domain to lay their claims out."""
    now = now or timezone.now()
    edges = bucket_edges(step, now)
    claims = Claim.objects.overlapping(max(edges[0], now), edges[-1])
    met = Exists(claims.filter(node=OuterRef("pk")))
    unbooked = (Device.objects.filter(vanished_at__isnull=True, node__in=open_nodes(now).exclude(met))
                .values("name").annotate(gpus=Count("pk", filter=Q(node__present=True))).order_by())
    booked = fleet_candidates(claims, now, Node.objects.filter(met))
    return edges, availability.fleet_free_by_model(booked, edges, {row["name"]: row["gpus"] for row in unbooked})


def kept_fleet_free(step: str, now: datetime | None = None) -> tuple[list[datetime], dict[str, list[int]], datetime]:
    """`fleet_free(step)` as computed at most GPUFLEET_AVAILABILITY_MAX_AGE_S ago, from the
    same first bucket (a new hour or day computes it again), and when it was computed."""
    now = now or timezone.now()
    key = f"free:{step}:{bucket_edges(step, now)[0].isoformat()}"
    return summary_keep.kept(key, lambda: (*fleet_free(step, now), now), settings.GPUFLEET_AVAILABILITY_MAX_AGE_S)


def kept_fleet_slots(request: availability.SlotRequest, now: datetime | None = None) -> tuple[list[availability.Slot], datetime]:
    """`fleet_slots(request)` as computed at most GPUFLEET_AVAILABILITY_MAX_AGE_S ago, and
    when it was computed; a request from now (or a time passed) shares the answer from then."""
    now = now or timezone.now()
    after = "now" if request.after <= now else request.after.isoformat()
    terms = repr((after, request.duration.total_seconds(), request.count, request.model, request.min_vram_mib))
    key = "slots:" + hashlib.sha256(terms.encode()).hexdigest()  # any cache backend takes it
    return summary_keep.kept(key, lambda: (fleet_slots(request, now), now), settings.GPUFLEET_AVAILABILITY_MAX_AGE_S)


def fleet_slots(request: availability.SlotRequest, now: datetime | None = None) -> list[availability.Slot]:
    """The earliest windows for `request`, best first (SLOTS_SHOWN of them); never before
    now. Three queries, whatever the fleet size. A node no claim meets in the window from
    `after` has its slot then, with every GPU free beside it, so of those only the best
    SLOTS_SHOWN can be listed, and SQL picks them; the domain finds the others' slots."""
    now = now or timezone.now()
    if request.after < now:
        request = replace(request, after=now)
    claims = Claim.objects.overlapping(request.after, None)
    met = Exists(Claim.objects.overlapping(request.after, request.after + request.duration).filter(node=OuterRef("pk")))
    nodes = Node.objects.filter(Q(met) | Q(pk__in=_free_at_once(request, now, met)))
    return availability.find_slots(request, fleet_candidates(claims, now, nodes), SLOTS_SHOWN)


def _free_at_once(request: availability.SlotRequest, now: datetime, met: Exists) -> QuerySet[Node]:
    """The open nodes that no claim meets in the window from `after` and whose GPUs can
    take the request, best first as `find_slots` ranks their slots (all then, the fewest
    GPUs left over, then the name in code point order as Python sorts it): SLOTS_SHOWN ids."""
    current = Q(devices__vanished_at__isnull=True)
    wanted = current & Q(devices__name__icontains=request.model.strip())
    if request.min_vram_mib > 0:
        wanted &= Q(devices__vram_total_mib__gte=request.min_vram_mib)
    usable = Q(runtime_installed=True) | ~Q(cdi_devices=[])  # gpu.Info.usable
    return (open_nodes(now).filter(usable, present=True).exclude(met)
            .annotate(gpus=Count("devices", filter=current), wanted=Count("devices", filter=wanted))
            .filter(gpus__gt=0, wanted__gte=request.count)
            .order_by("gpus", Collate("name", "C" if connection.vendor == "postgresql" else "BINARY"))
            .values("pk")[:SLOTS_SHOWN])
