"""Reminders to claim owners. The central beat emails a booking's owner (through
gpufleet/usage/notify.py, as for idle claims) once it starts within REMINDER_LEAD, and a
claim's owner once it ends within REMINDER_LEAD: once each, remembered on the claim
(`start_reminded_at`, `end_reminded_at`), which a save that moves the start or the end
clears so that the new time is reminded. A start already past is not reminded. The
claims page shows each person the same claims of theirs (`Claim.objects.starting_soon`,
`ending_soon`), so an owner with no address is told there."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from gpufleet.claims.models import Claim
from gpufleet.usage import idle, notify


@dataclass
class Outcome:
    starting: list[str] = field(default_factory=list)
    ending: list[str] = field(default_factory=list)


def run(now: datetime | None = None) -> Outcome:
    """One beat tick: remind the owners of the claims that start, or end, within the lead
    and were not reminded of it yet."""
    now = now or timezone.now()
    outcome = Outcome()
    for claim in _owned(Claim.objects.starting_soon(now).filter(start_reminded_at__isnull=True)):
        # Only while the start read is still the claim's: an edit meanwhile is reminded anew.
        if Claim.objects.filter(pk=claim.pk, starts_at=claim.starts_at, start_reminded_at__isnull=True).update(
                start_reminded_at=now):
            _remind_start(claim)
            outcome.starting.append(f"{claim.name} on {claim.node.name}")
    for claim in _owned(Claim.objects.ending_soon(now).filter(end_reminded_at__isnull=True)):
        if Claim.objects.filter(pk=claim.pk, ends_at=claim.ends_at, end_reminded_at__isnull=True).update(
                end_reminded_at=now):
            _remind_end(claim)
            outcome.ending.append(f"{claim.name} on {claim.node.name}")
    return outcome


def _owned(claims) -> list[Claim]:
    """Those with an owner to tell; a claim with none has nobody to remind."""
    return list(claims.filter(owner__isnull=False).select_related("node", "owner").order_by("pk"))


def _remind_start(claim: Claim) -> None:
    no_show = ""
    if settings.GPUFLEET_NO_SHOW_HOURS > 0:
        no_show = (f"\n\nIf none of its GPUs does any work within {settings.GPUFLEET_NO_SHOW_HOURS:g} hours of its"
                   f" start it is a no-show: you will be told, and it is released"
                   f" {settings.GPUFLEET_IDLE_GRACE_HOURS:g} hours later unless one of its GPUs does work.")
    body = (f"Your booking {claim.name!r} ({claim.describe()}) on {claim.node.name} starts soon: it holds its GPUs"
            f" {claim.window()}.{no_show}\n\nIf you no longer need them, release the booking so that others can use"
            f" them:\n{idle.claim_link(claim)}\n")
    notify.tell_owner(claim, f"gpufleet: your booking {claim.name} on {claim.node.name} starts soon", body)


def _remind_end(claim: Claim) -> None:
    body = (f"Your claim {claim.name!r} ({claim.describe()}) on {claim.node.name} ends soon: it holds its GPUs"
            f" {claim.window()}, when they are free for others.\n\nTo keep them longer, give it a later end, if no"
            f" booking is in the way:\n{idle.claim_link(claim)}\n")
    notify.tell_owner(claim, f"gpufleet: your claim {claim.name} on {claim.node.name} ends soon", body)
