"""A team's quotas against its claims across the fleet: the reading side of the pure
check (gpufleet/gpu/quota.py). `save_claim` and `save_series` ask `exceeded` under the
team's row lock; the team page shows `standing`. The team's claims are read in two
queries (its claims, then the current GPUs of their nodes) whatever the fleet's size."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims.models import Claim, with_current_devices
from gpufleet.core.access import MANAGE_USERS, can
from gpufleet.fleet.models import Node
from gpufleet.gpu import quota as quotas
from gpufleet.teams.models import Team


def may_override(user) -> bool:
    """Whether `user` may book over a team's quota, saying why: the admin role (a superuser too)."""
    return can(user, MANAGE_USERS)


def open_for() -> timedelta:
    """How long an open-ended claim is counted as holding its GPUs, for GPU-hours."""
    return timedelta(days=settings.GPUFLEET_MAX_RESERVATION_DAYS)


def exceeded(
    team: Team, node: Node, proposed: Sequence[gpu.Claim], editing: Claim | None = None,
) -> quotas.Exceeded | None:
    """The first of the team's quotas that the claims `proposed` on `node` (one claim, or
    the occurrences of a repeating booking) would exceed beside the team's other claims
    (all but `editing`), or None. For an edit that stays in the team, the claim as stored
    is given to the check, which never refuses an edit asking no more than that."""
    limits = team.quota()
    if not limits.limited:
        return None
    now = timezone.localtime()
    ledger = node.ledger(claims=())
    asked = [quotas.holding(_local(claim), ledger, now) for claim in proposed]
    # The earliest instant any quota looks at: the month of the earliest start, or now.
    since = min([now, *(quotas.month_start(h.starts_at.astimezone(now.tzinfo)) for h in asked)])
    others = _holdings(team, since, editing)
    before = ()
    if editing is not None and editing.team_id == team.pk:
        before = (quotas.holding(editing.as_gpu_claim(), ledger, now),)
    return quotas.check(limits, others, asked, now, open_for(), before=before)


def standing(team: Team, now: datetime | None = None) -> quotas.Standing:
    """What the team holds now, has booked ahead, and has reserved this calendar month."""
    now = timezone.localtime(now)
    return quotas.standing(_holdings(team, min(now, quotas.month_start(now))), now, open_for())


def team_quota_context(team: Team) -> dict:
    """Context for templates/teams/_quota.html: the team's quotas and where it stands."""
    return {
        "team": team,
        "quota": team.quota(),
        "quota_by_model": sorted(team.quota().max_gpus_by_model.items()),
        "standing": standing(team),
        "ahead_hours": int(quotas.AHEAD / timedelta(hours=1)),
    }


def _holdings(team: Team, since: datetime, editing: Claim | None = None) -> list[quotas.Holding]:
    """The team's claims across the fleet that hold GPUs after `since`, as the quota check
    counts them (each on its node's current GPUs)."""
    claims = Claim.objects.filter(team=team).filter(Q(ends_at__isnull=True) | Q(ends_at__gt=since))
    if editing is not None and editing.pk:
        claims = claims.exclude(pk=editing.pk)
    rows = list(claims.select_related("node"))
    with_current_devices(rows, only_pinned=False)
    ledgers: dict[int, gpu.Ledger] = {}
    found = []
    for row in rows:
        if row.node_id not in ledgers:
            ledgers[row.node_id] = row.node.ledger(claims=(), devices=row.node.current_devices())
        found.append(quotas.holding(row.as_gpu_claim(), ledgers[row.node_id], since))
    return found


def _local(claim: gpu.Claim) -> gpu.Claim:
    # The check's sentences name times in the site's zone, as the ledger's do.
    return replace(claim, starts_at=claim.starts_at and timezone.localtime(claim.starts_at),
                   ends_at=claim.ends_at and timezone.localtime(claim.ends_at))
