"""What a real site of the bench fleet's size has on its list pages, made in bulk: claims
on about a third of the nodes across many owners (some ended, some idle or naming a
vanished GPU), bookings ahead over the next two weeks on another third, events on most
nodes (a few thousand open, the rest closed over the last weeks) and the claims' audit
rows, so the claims, events and audit lists, the node page and the API lists are timed
with realistic content rather than empty tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from django.contrib.auth import get_user_model

from gpufleet.audit.models import Action, AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event, Kind, Severity
from gpufleet.fleet.models import Node

BATCH = 2000
# One owner per this many claims: a team-sized share of the fleet each.
CLAIMS_PER_OWNER = 100
# Bookings ahead reach this far: the horizon the node page's calendar and the fleet's
# availability show.
BOOKING_DAYS = 14
OWNER_PREFIX = "bench-owner-"
WORKLOADS = ("train", "eval", "infer", "finetune", "notebook", "batch")
EVENT_KINDS = (
    (Kind.FINDING, Severity.WARN), (Kind.OFFLINE, Severity.FAIL), (Kind.GPU_VANISHED, Severity.FAIL),
    (Kind.CLAIM_EXPIRED, Severity.INFO), (Kind.KEY_ROTATED, Severity.INFO), (Kind.FINDING, Severity.FAIL),
)


def populate_lists(node_ids: Sequence[int], say: Callable[[str], None] = print, now: datetime | None = None) -> dict:
    """Claims on every third node (1 to 8 GPUs, one in ten ended), bookings ahead on a
    third of the others (`_bookings`), five events for every six nodes (one in fifteen
    open), and one audit row per claim and booking. Returns how many of each it made."""
    now = now or datetime.now(UTC)
    node_ids = list(node_ids)
    claimed = node_ids[::3]
    say(f"creating {len(claimed)} claims, bookings ahead on {len(_booked(node_ids))} nodes, "
        f"{len(node_ids) * 5 // 6} events and the claims' audit rows ...")
    owners = _owners(max(1, len(claimed) // CLAIMS_PER_OWNER))
    claims = [_claim(i, node_id, owners[i % len(owners)], now) for i, node_id in enumerate(claimed)]
    bookings = _bookings(_booked(node_ids), owners, now)
    Claim.objects.bulk_create(claims + bookings, batch_size=BATCH)
    names = dict(Node.objects.values_list("id", "name"))
    AuditEntry.objects.bulk_create(
        [_audit(claim, names[claim.node_id], now) for claim in claims + bookings], batch_size=BATCH
    )
    events = [_event(i, node_ids[(i * 6 // 5) % len(node_ids)], now) for i in range(len(node_ids) * 5 // 6)]
    Event.objects.bulk_create(events, batch_size=BATCH)
    return {"owners": len(owners), "claims": len(claims), "bookings": len(bookings), "events": len(events),
            "audit": len(claims) + len(bookings)}


def _owners(count: int) -> list:
    user_model = get_user_model()
    users = [user_model(username=f"{OWNER_PREFIX}{n:04d}") for n in range(count)]
    user_model.objects.bulk_create(users, batch_size=BATCH)
    return list(user_model.objects.filter(username__startswith=OWNER_PREFIX).order_by("username"))


def _claim(i: int, node_id: int, owner, now: datetime) -> Claim:
    ends = None
    if i % 10 == 0:
        ends = now - timedelta(hours=1 + i % 48)
    elif i % 10 < 5:
        ends = now + timedelta(days=1 + i % 30)
    return Claim(
        node_id=node_id,
        name=f"{WORKLOADS[i % len(WORKLOADS)]}-{i:05d}",
        count=1 + i % 8,
        owner=owner,
        created_by=owner,
        contact=f"#team-{i % 40}" if i % 3 else "",
        starts_at=now - timedelta(days=3),
        ends_at=ends,
        idle_since=now - timedelta(hours=30) if i % 25 == 0 else None,
        missing_devices=["GPU-missing"] if i % 500 == 0 else [],
    )


def _booked(node_ids: list[int]) -> list[int]:
    """The nodes with bookings ahead: every other one of those without a claim (a third of
    the fleet, the bench's node page among them), so that what is booked fits beside what
    is held."""
    return [node_id for position, node_id in enumerate(node_ids) if position % 6 in (1, 5)]


def _bookings(node_ids: list[int], owners: list, now: datetime) -> list[Claim]:
    """One to four bookings ahead on each node, one after another within BOOKING_DAYS (the
    first within a day, then 4 to 51 hours each with a gap of 2 to 25 hours), a third
    pinning GPU 0 (and 1), the rest a count of 1 to 8."""
    horizon = now + timedelta(days=BOOKING_DAYS)
    made: list[Claim] = []
    for n, node_id in enumerate(node_ids):
        starts_at = (now + timedelta(hours=1 + n % 24)).replace(minute=0, second=0, microsecond=0)
        for _ in range(1 + n % 4):
            i = len(made)
            ends_at = starts_at + timedelta(hours=4 + i * 7 % 48)
            if ends_at > horizon:
                break
            pinned = [str(index) for index in range(1 + i % 2)] if i % 3 == 0 else []
            owner = owners[i % len(owners)]
            made.append(Claim(
                node_id=node_id, name=f"{WORKLOADS[i % len(WORKLOADS)]}-ahead-{i:05d}",
                count=0 if pinned else 1 + i % 8, device_ids=pinned, owner=owner, created_by=owner,
                contact=f"#team-{i % 40}" if i % 3 else "", starts_at=starts_at, ends_at=ends_at,
            ))
            starts_at = ends_at + timedelta(hours=2 + i % 24)
    return made


def _audit(claim: Claim, node_name: str, now: datetime) -> AuditEntry:
    return AuditEntry(
        at=now - timedelta(minutes=claim.count * 7),
        user=claim.owner,
        username=claim.owner.get_username(),
        action=Action.CLAIM_CREATE,
        node_id=claim.node_id,
        node_name=node_name,
        target=claim.name,
        after={"name": claim.name, "count": claim.count, "device_ids": claim.device_ids},
    )


def _event(i: int, node_id: int, now: datetime) -> Event:
    kind, severity = EVENT_KINDS[i % len(EVENT_KINDS)]
    opened = now - timedelta(minutes=5 + 17 * i % (60 * 24 * 30))
    is_open = i % 15 == 0
    return Event(
        kind=kind,
        severity=severity,
        node_id=node_id,
        gpu_index=i % 8 if kind in (Kind.FINDING, Kind.GPU_VANISHED) else None,
        code=f"gpu{i % 8}.bench-{i}",
        name=f"GPU {i % 8} condition {i}",
        message_opened="Temperature 91 C above its slowdown point",
        message="Temperature 91 C above its slowdown point",
        first_seen_at=opened - timedelta(seconds=30),
        opened_at=opened,
        last_seen_at=now if is_open else opened + timedelta(minutes=20),
        closed_at=None if is_open else opened + timedelta(minutes=20),
    )
