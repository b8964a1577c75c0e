"""Team quotas: whether a team's booking keeps within the limits set for the team. Pure:
the caller gives the team's other claims and the booking as `Holding`s (the GPUs each
holds over its window) and the time; `check` answers the first quota exceeded, or None.

How GPUs and hours are counted, as the usage accounting counts reserved hours: a claim
pinning GPUs holds those, one taking a whole node every GPU of it, one for a count that
many. A claim holds them over its window [starts_at, ends_at), so "at once" is the most
GPUs held together at any instant (a sweep over the windows' edges), not a sum.

An open-ended claim holds its GPUs for ever as far as anyone can tell: at once it counts
for all time. Hours need an end, so for GPU-hours it is counted as ending `open_for`
(the site's longest window, GPUFLEET_MAX_RESERVATION_DAYS) after now, or after its
start when that is later: as long as the longest booking with an end may hold them.

GPU-hours per month: each calendar month (in the time zone of `now`) on its own, the
past part of the month included; a booking over two months counts each part in its
month. GPU-hours ahead: the part of every window beyond `now` + AHEAD, so that long
bookings ahead cannot lock the fleet while GPUs free today can still be taken."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from gpufleet.gpu.devices import Device
from gpufleet.gpu.ledger import Claim, Ledger, moment_text
from gpufleet.gpu.placement import is_model

# The quotas, by the names the team's fields and the API give them.
MAX_GPUS = "max_gpus"
MAX_GPUS_BY_MODEL = "max_gpus_by_model"
GPU_HOURS_PER_MONTH = "gpu_hours_per_month"
MAX_GPU_HOURS_AHEAD = "max_gpu_hours_ahead"

# What may be taken at short notice: GPU-hours within this of now are not "ahead".
AHEAD = timedelta(hours=24)


@dataclass(frozen=True)
class Quota:
    """A team's limits; None (or no model) is no limit. Models are matched as find-a-node
    matches them: a case-insensitive part of the GPU's name ("H100")."""

    max_gpus: int | None = None
    max_gpus_by_model: Mapping[str, int] = field(default_factory=dict)
    gpu_hours_per_month: int | None = None
    max_gpu_hours_ahead: int | None = None

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_gpus, self.gpu_hours_per_month, self.max_gpu_hours_ahead)) or bool(
            self.max_gpus_by_model)


@dataclass(frozen=True)
class Holding:
    """The GPUs one claim holds over its window (`ends_at` None: no end): `gpus` of them,
    from among `devices`, its own pinned GPUs or for a count or a whole node the node's
    (a count may be given any of them, so it counts against each model's quota up to
    how many of that model the node has)."""

    name: str
    gpus: int
    starts_at: datetime
    ends_at: datetime | None = None
    devices: tuple[Device, ...] = ()

    def of_model(self, model: str) -> int:
        return min(self.gpus, sum(1 for d in self.devices if is_model(d, model)))


def holding(claim: Claim, ledger: Ledger, starts_at: datetime) -> Holding:
    """What `claim` holds on the node of `ledger` (its GPUs; the claims are not read).
    `starts_at` stands in for a claim without a start (one starting now). A pinned id
    the node no longer reports still counts: the claim holds that GPU if it returns."""
    start = claim.starts_at or starts_at
    devices = ledger.info.devices
    if claim.device_ids:
        found = {d.index: d for d in (ledger.resolve(i) for i in claim.device_ids) if d is not None}
        unknown = sum(1 for i in claim.device_ids if ledger.resolve(i) is None)
        return Holding(claim.name, len(found) + unknown, start, claim.ends_at, tuple(found.values()))
    gpus = ledger.total if claim.all else claim.count
    return Holding(claim.name, gpus, start, claim.ends_at, tuple(devices))


@dataclass(frozen=True)
class Exceeded:
    """A quota the booking would exceed: `limit`, what the team `held` beside the booking
    (GPUs at the instant `at`; GPU-hours in the month starting `at`; GPU-hours ahead) and
    what the booking `asks` there. str() is the sentence for people."""

    code: ClassVar[str] = "quota_exceeded"

    quota: str
    limit: float
    held: float
    asks: float
    at: datetime | None = None
    model: str = ""

    def __str__(self) -> str:
        held, asks, limit = _number(self.held), _number(self.asks), _number(self.limit)
        if self.quota in (MAX_GPUS, MAX_GPUS_BY_MODEL):
            what = f"{self.model} GPUs" if self.model else "GPUs"
            return (f"the booking is over the team's quota of {limit} {what} at once: from {moment_text(self.at)}"
                    f" the team holds {held} and the booking asks {asks} more")
        if self.quota == GPU_HOURS_PER_MONTH:
            return (f"the booking is over the team's quota of {limit} GPU-hours a month: in {self.at:%B %Y} the team"
                    f" has reserved {held} GPU-hours and the booking asks {asks} more")
        return (f"the booking is over the team's quota of {limit} GPU-hours booked beyond the next"
                f" {AHEAD // timedelta(hours=1)} hours: the team holds {held} such GPU-hours and the"
                f" booking asks {asks} more")


def _number(value: float) -> str:
    rounded = round(value, 1)
    return f"{rounded:g}" if rounded != int(rounded) else str(int(rounded))


def check(
    quota: Quota, others: Sequence[Holding], proposed: Sequence[Holding], now: datetime, open_for: timedelta,
    before: Sequence[Holding] = (),
) -> Exceeded | None:
    """The first quota (GPUs at once, then by model, per month, ahead) that the team's
    claims `others` and the booking `proposed` (one claim, or every occurrence of a
    repeating one) exceed together where the booking holds GPUs; None when all keep.
    `before`: an edited claim as it was, so that an edit asking no more than the claim
    held (no wider window, no more GPUs of any model) is never refused, and a claim
    over a quota lowered since can still be shortened or given a new name."""
    proposed = [h for h in proposed if h.gpus > 0]
    if not proposed or not quota.limited:
        return None
    if before and all(any(_within(p, b) for b in before) for p in proposed):
        return None
    if quota.max_gpus is not None:
        found = _first_excess(others, proposed, lambda h: h.gpus, quota.max_gpus)
        if found is not None:
            return Exceeded(MAX_GPUS, quota.max_gpus, *found)
    for model, limit in sorted(quota.max_gpus_by_model.items()):
        found = _first_excess(others, proposed, lambda h, model=model: h.of_model(model), limit)
        if found is not None:
            return Exceeded(MAX_GPUS_BY_MODEL, limit, *found, model=model)
    if quota.gpu_hours_per_month is not None:
        for start, end in _months(proposed, now, open_for):
            held = _gpu_hours(others, start, end, now, open_for)
            asks = _gpu_hours(proposed, start, end, now, open_for)
            if asks > 0 and _over(held + asks, quota.gpu_hours_per_month):
                return Exceeded(GPU_HOURS_PER_MONTH, quota.gpu_hours_per_month, held, asks, start)
    if quota.max_gpu_hours_ahead is not None:
        held = _gpu_hours(others, now + AHEAD, None, now, open_for)
        asks = _gpu_hours(proposed, now + AHEAD, None, now, open_for)
        if asks > 0 and _over(held + asks, quota.max_gpu_hours_ahead):
            return Exceeded(MAX_GPU_HOURS_AHEAD, quota.max_gpu_hours_ahead, held, asks)
    return None


@dataclass(frozen=True)
class Standing:
    """Where a team stands now: GPUs it holds, bookings that start later, GPU-hours it has
    booked beyond now + AHEAD, and GPU-hours of this calendar month: reserved so far and in
    all (as counted against the monthly quota)."""

    gpus_now: int
    bookings_ahead: int
    gpu_hours_ahead: float
    month_so_far: float
    month_total: float
    month: datetime


def standing(holdings: Sequence[Holding], now: datetime, open_for: timedelta) -> Standing:
    start, end = _month_of(now)
    in_force = [h for h in holdings if h.starts_at <= now and (h.ends_at is None or now < h.ends_at)]
    return Standing(
        gpus_now=sum(h.gpus for h in in_force),
        bookings_ahead=sum(1 for h in holdings if h.starts_at > now),
        gpu_hours_ahead=_gpu_hours(holdings, now + AHEAD, None, now, open_for),
        month_so_far=_gpu_hours(holdings, start, now, now, open_for),
        month_total=_gpu_hours(holdings, start, end, now, open_for),
        month=start,
    )


def _within(after: Holding, before: Holding) -> bool:
    """Whether `after` asks nothing `before` did not hold: window and GPUs of each model."""
    ends_within = before.ends_at is None or (after.ends_at is not None and after.ends_at <= before.ends_at)
    models = {d.name for d in after.devices}
    return (after.starts_at >= before.starts_at and ends_within and after.gpus <= before.gpus
            and all(_exactly(after, m) <= _exactly(before, m) for m in models))


def _exactly(h: Holding, model: str) -> int:
    return min(h.gpus, sum(1 for d in h.devices if d.name == model))


def _first_excess(
    others: Iterable[Holding], proposed: Iterable[Holding], weight: Callable[[Holding], int], limit: int,
) -> tuple[int, int, datetime] | None:
    """(held, asks, at): the team's GPUs beside the booking's at the first instant where
    the booking holds some and together they pass `limit`; the GPUs held change only
    where a window starts or ends, so those instants are the only ones to look at."""
    edges: dict[datetime, list[tuple[int, bool]]] = {}
    for h, mine in [*((h, False) for h in others), *((h, True) for h in proposed)]:
        gpus = weight(h)
        if gpus <= 0:
            continue
        edges.setdefault(h.starts_at, []).append((gpus, mine))
        if h.ends_at is not None:
            edges.setdefault(h.ends_at, []).append((-gpus, mine))
    held = asks = 0
    for moment in sorted(edges):
        for change, mine in edges[moment]:
            if mine:
                asks += change
            else:
                held += change
        if asks > 0 and held + asks > limit:
            return held, asks, moment
    return None


def counted_end(h: Holding, now: datetime, open_for: timedelta) -> datetime:
    """Where a window ends for counting GPU-hours (see the module's note on open ends)."""
    return h.ends_at if h.ends_at is not None else max(h.starts_at, now) + open_for


def _gpu_hours(holdings: Iterable[Holding], start: datetime, end: datetime | None, now: datetime,
               open_for: timedelta) -> float:
    """GPU-hours the holdings hold within [start, end) (end None: no end)."""
    total = 0.0
    for h in holdings:
        lo = max(h.starts_at, start)
        hi = counted_end(h, now, open_for)
        hi = hi if end is None else min(hi, end)
        if hi > lo:
            total += h.gpus * _hours(lo, hi)
    return total


def _hours(start: datetime, end: datetime) -> float:
    # In UTC: times of one zone subtract by their wall clocks, across a change of summer time too.
    return (end.astimezone(UTC) - start.astimezone(UTC)).total_seconds() / 3600


def _over(total: float, limit: float) -> bool:
    return total > limit + 1e-9  # sums of fractions of hours


def _months(holdings: Iterable[Holding], now: datetime, open_for: timedelta) -> list[tuple[datetime, datetime]]:
    """The calendar months (start, end) the holdings' counted windows meet, in order."""
    months = set()
    for h in holdings:
        end = counted_end(h, now, open_for)
        month = _month_of(h.starts_at.astimezone(now.tzinfo))
        while month[0] < end:
            months.add(month)
            month = _month_of(month[1])
    return sorted(months)


def month_start(moment: datetime) -> datetime:
    """The start of the calendar month of `moment`, in its own time zone."""
    return _month_of(moment)[0]


def _month_of(moment: datetime) -> tuple[datetime, datetime]:
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
    return start, start.replace(year=year, month=month)
