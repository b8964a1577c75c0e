"""Idle claims handed back. Ingest sets `Claim.idle_since` once none of a claim's GPUs did
any work for GPUFLEET_IDLE_HOURS, and clears it when one does. The central beat then:

- tells the owner, once per idle spell: an email (gpufleet/usage/notify.py) with the
  GPU-hours the claim held unused since it went idle and a link to it, and a claim-idle
  event, which alert rules may send to their channels; `Claim.idle_warned_at` says when;
- with GPUFLEET_RELEASE_IDLE, releases a claim still idle GPUFLEET_IDLE_GRACE_HOURS
  after that, through the claims' delete path (node lock, audited as a delete by
  "system", a claim-released event), and tells the owner. A no-show (`Claim.no_show`: a
  booking that did no work since it started, flagged GPUFLEET_NO_SHOW_HOURS after its
  start) is released so whatever GPUFLEET_RELEASE_IDLE says: its GPUs were booked for
  work that did not come.

A warning older than the claim's idle_since belongs to an earlier spell: the claim did
work since, and is told again when it goes idle again."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
from gpufleet.events import services as events
from gpufleet.fleet.models import Node
from gpufleet.usage import notify
from gpufleet.usage.report import report

# Not told yet of its current idle spell.
_UNTOLD = Q(idle_warned_at__isnull=True) | Q(idle_warned_at__lt=F("idle_since"))
RELEASE_REASON = "as it stayed idle after its owner was told"


@dataclass
class Outcome:
    warned: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)


def run(now: datetime | None = None) -> Outcome:
    """One beat tick: forget the warnings of claims that did work, tell the owners of
    the newly idle ones, and release those idle past the grace (all of them with
    GPUFLEET_RELEASE_IDLE, else the no-shows)."""
    now = now or timezone.now()
    Claim.objects.filter(idle_since__isnull=True, idle_warned_at__isnull=False).update(idle_warned_at=None)
    outcome = Outcome()
    for claim in _claims(Q(idle_since__isnull=False) & _UNTOLD, now):
        if warn(claim, now):
            outcome.warned.append(f"{claim.name} on {claim.node.name}")
    due = now - grace()
    releasable = Claim.objects.all() if settings.GPUFLEET_RELEASE_IDLE else Claim.objects.no_shows()
    for claim in _claims(Q(idle_since__isnull=False, idle_warned_at__gte=F("idle_since"), idle_warned_at__lte=due),
                         now, releasable):
        if release(claim, now):
            outcome.released.append(f"{claim.name} on {claim.node.name}")
    return outcome


def released_after_grace(claim: Claim) -> bool:
    return settings.GPUFLEET_RELEASE_IDLE or claim.no_show


def grace() -> timedelta:
    return timedelta(hours=settings.GPUFLEET_IDLE_GRACE_HOURS)


def _claims(condition: Q, now: datetime, among: models.QuerySet | None = None) -> list[Claim]:
    """The claims in force (of `among`) that meet `condition`: an ended claim holds nothing to hand back."""
    claims = Claim.objects.all() if among is None else among
    return list(claims.in_force(now).filter(condition).select_related("node", "owner").order_by("pk"))


def wasted_hours(claim: Claim, now: datetime) -> float:
    """GPU-hours the claim held and did no work on since it went idle."""
    return report(claim.idle_since, now, "claim", {"claim_id": claim.pk}).total.idle_reserved


def claim_link(claim: Claim) -> str:
    """The claim on its node's page, as people reach the site."""
    return notify.link(reverse("fleet:node_detail", args=[claim.node.name]) + f"#claim-{claim.pk}")


def warn(claim: Claim, now: datetime) -> bool:
    """Tell the owner that `claim` sits idle; False if it did work (or was told) meanwhile."""
    wasted = wasted_hours(claim, now)
    since = f"{claim.idle_since:%Y-%m-%d %H:%M} UTC"
    if claim.no_show:
        what, since = f"Booking {claim.name!r} ({claim.describe()}) on {claim.node.name}", f"it started at {since}"
        subject = f"gpufleet: your booking {claim.name} on {claim.node.name} was not used"
    else:
        what = f"Claim {claim.name!r} ({claim.describe()}) on {claim.node.name}"
        subject = f"gpufleet: your claim {claim.name} on {claim.node.name} is idle"
    then = ""
    if released_after_grace(claim):
        then = f" It will be released at {now + grace():%Y-%m-%d %H:%M} UTC unless one of its GPUs does work."
    message = (f"{what} has done no work since {since}: {notify.hours(wasted)} GPU-hours reserved and unused."
               f"{then}")
    with transaction.atomic():
        # Only while the spell read is still the current one: ingest may have ended it.
        told = Claim.objects.filter(_UNTOLD, pk=claim.pk, idle_since=claim.idle_since).update(idle_warned_at=now)
        if not told:
            return False
        events.claim_idle(claim.node_id, claim.name, message, now=now)
    body = (f"{message}\n\nIf you still need these GPUs, start your work on them; if not, release the claim so "
            f"that others can use them:\n{claim_link(claim)}\n")
    notify.tell_owner(claim, subject, body)
    return True


def release(claim: Claim, now: datetime) -> bool:
    """Release `claim`, idle past its grace, and tell the owner; False if it did work,
    changed or went meanwhile."""
    wasted = wasted_hours(claim, now)
    with transaction.atomic():
        # Under the node's lock ingest writes idle_since: read here, it is the current one.
        list(Node.objects.select_for_update().filter(pk=claim.node_id).values_list("pk", flat=True))
        current = Claim.objects.filter(pk=claim.pk, idle_since=claim.idle_since,
                                       idle_warned_at=claim.idle_warned_at).first()
        if current is None or not released_after_grace(current):
            return False
        try:
            claims.delete_claim(current, None, expected_updated_at=current.updated_at, reason=RELEASE_REASON)
        except (claims.ClaimGone, claims.StaleClaim):
            return False
    body = (f"Claim {claim.name!r} ({claim.describe()}) on {claim.node.name} was released: none of its GPUs did "
            f"any work since {claim.idle_since:%Y-%m-%d %H:%M} UTC ({notify.hours(wasted)} GPU-hours reserved "
            f"and unused), and none did in the {notify.hours(settings.GPUFLEET_IDLE_GRACE_HOURS)} hours after "
            f"you were told at {claim.idle_warned_at:%Y-%m-%d %H:%M} UTC.\n\nClaim GPUs again when you need "
            f"them:\n{notify.link(reverse('fleet:node_detail', args=[claim.node.name]))}\n")
    notify.tell_owner(claim, f"gpufleet: your idle claim {claim.name} on {claim.node.name} was released", body)
    return True
