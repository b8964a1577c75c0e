"""When GPUs are free: one node's ledger laid out over time, for a calendar, for free
counts per hour or day, and for the earliest window that N GPUs are free.

A pinned or whole-node claim holds its GPUs over its window; a claim for a count holds
no GPU in particular, so it only lowers the node's free count. A GPU is free at an
instant when no claim holds it and the node's free count is at least one: exactly when
the ledger would take a claim pinning it. A slot offered here is checked by `Ledger.fit`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import accumulate

from gpufleet.gpu.devices import Device
from gpufleet.gpu.ledger import Claim, Ledger
from gpufleet.gpu.placement import Candidate, is_model

# The name of the hypothetical claim a slot is checked as; never stored.
PROBE = "slot"

HELD, FULL, FREE = "held", "full", "free"


@dataclass(frozen=True)
class Piece:
    """[starts_at, ends_at), over which the claims in force do not change: `ledger`."""

    starts_at: datetime
    ends_at: datetime
    ledger: Ledger


def pieces(ledger: Ledger, start: datetime, end: datetime) -> list[Piece]:
    """[start, end) cut wherever one of the ledger's claims starts or ends."""
    inside = {t for c in ledger.claims for t in (c.starts_at, c.ends_at) if t is not None and start < t < end}
    points = [start, *sorted(inside), end]
    return [Piece(a, b, Ledger(ledger.info, [c for c in ledger.claims if c.in_force(a)]))
            for a, b in zip(points, points[1:], strict=False) if a < b]


def by_index(ledger: Ledger) -> Ledger:
    """The same ledger with each pinned claim naming its GPUs by index, resolved once
    here rather than at every instant asked about; a claim whose ids name no GPU of the
    node pins nothing, so it is left out (it would otherwise read as every GPU)."""
    claims = []
    for claim in ledger.claims:
        if claim.device_ids:
            pinned = ledger.pinned(claim)
            if not pinned:
                continue
            claim = replace(claim, device_ids=tuple(str(i) for i in sorted(pinned)))
        claims.append(claim)
    return Ledger(ledger.info, claims)


# --- a calendar: each GPU's hours -------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Consecutive slots of one GPU in one state: HELD by `claim`, FREE, or FULL (no
    claim holds the GPU but claims for a count take every GPU left)."""

    first: int
    slots: int
    state: str
    starts_at: datetime
    ends_at: datetime
    claim: Claim | None = None


@dataclass(frozen=True)
class Lane:
    device: Device
    runs: tuple[Run, ...]


def lanes(ledger: Ledger, start: datetime, step: timedelta, slots: int) -> list[Lane]:
    """Each GPU's slots [start + i*step, start + (i+1)*step) for a calendar: HELD by the
    first claim holding the GPU at any instant of the slot, else FULL if the GPU cannot
    be booked at some instant of it, else FREE; runs of equal slots merged."""
    edges = [start + i * step for i in range(slots + 1)]
    cut = pieces(by_index(ledger), edges[0], edges[-1])
    found = []
    for device in ledger.info.devices:
        states: list[tuple[str, Claim | None]] = []
        at = 0
        for a, b in zip(edges, edges[1:], strict=False):
            while cut[at].ends_at <= a:
                at += 1
            state: tuple[str, Claim | None] = (FREE, None)
            for piece in cut[at:]:
                if piece.starts_at >= b:
                    break
                holder = piece.ledger.holding(device.index)
                if holder is not None:
                    state = (HELD, holder)
                    break
                if piece.ledger.free < 1:
                    state = (FULL, None)
            states.append(state)
        found.append(Lane(device, tuple(_runs(states, edges))))
    return found


def _runs(states: list[tuple[str, Claim | None]], edges: list[datetime]) -> list[Run]:
    runs: list[Run] = []
    first = 0
    for i in range(1, len(states) + 1):
        if i == len(states) or states[i] != states[first]:
            state, claim = states[first]
            runs.append(Run(first, i - first, state, edges[first], edges[i], claim))
            first = i
    return runs


def count_lanes(ledger: Ledger, start: datetime, step: timedelta, slots: int) -> list[tuple[Claim, tuple[Run, ...]]]:
    """The claims for a count of GPUs that meet the calendar, each with its slots (HELD
    where it is in force at any instant of one, else ""): they hold no GPU in
    particular, so a calendar shows each on a line of its own."""
    edges = [start + i * step for i in range(slots + 1)]
    found = []
    for claim in ledger.claims:
        if claim.device_ids or claim.count <= 0 or not claim.overlaps(Claim(PROBE, starts_at=edges[0], ends_at=edges[-1])):
            continue
        states = [(HELD, claim) if claim.overlaps(Claim(PROBE, starts_at=a, ends_at=b)) else ("", None)
                  for a, b in zip(edges, edges[1:], strict=False)]
        found.append((claim, tuple(_runs(states, edges))))
    return sorted(found, key=lambda pair: (next(r.first for r in pair[1] if r.state == HELD), pair[0].name))


# --- free GPUs per model per hour or day ------------------------------------------


def fleet_free_by_model(candidates: Iterable[Candidate], edges: list[datetime],
                        unbooked: Mapping[str, int] | None = None) -> dict[str, list[int]]:
    """For each GPU model, how many GPUs of the nodes that take new work (Candidate.closed)
    are free throughout each bucket [edges[i], edges[i+1]) (the fewest free at any instant
    of it), summed over the nodes; plus `unbooked`: per model, the GPUs of open nodes left
    out of `candidates` because no claim meets the buckets (free throughout; 0 for a node
    whose GPUs are not present), which a caller may count without reading each node."""
    totals = _Totals(len(edges) - 1)
    for model, gpus in (unbooked or {}).items():
        totals.add_throughout(model, gpus)
    for candidate in candidates:
        if candidate.closed() is None:
            totals.add(candidate.ledger, edges)
    return totals.counts()


class _Totals:
    """Free GPUs per model per bucket, summed over nodes. Each node adds what it has
    free over each span its claims do not change, so its cost follows its claims' starts
    and ends rather than the buckets: a span's value is added to the buckets it covers
    whole through a difference array, and a bucket it shares with another span gets the
    fewest of theirs."""

    def __init__(self, buckets: int) -> None:
        self.buckets = max(0, buckets)
        self.steps: dict[str, list[int]] = {}  # per model: differences between consecutive buckets

    def _steps(self, model: str) -> list[int]:
        return self.steps.setdefault(model, [0] * (self.buckets + 1))

    def add_throughout(self, model: str, gpus: int) -> None:
        steps = self._steps(model)
        steps[0] += gpus
        steps[self.buckets] -= gpus

    def add(self, ledger: Ledger, edges: list[datetime]) -> None:
        models = sorted({d.name for d in ledger.info.devices})
        if not ledger.claims or self.buckets == 0:
            per_model = Counter(d.name for d in ledger.info.devices)
            for model in models:
                self.add_throughout(model, per_model[model] if ledger.total else 0)
            return
        steps = [self._steps(model) for model in models]
        shared: dict[tuple[int, int], int] = {}  # (model, bucket) -> the fewest free of the spans meeting it
        for starts_at, ends_at, free in _free_spans(ledger, models, edges[0], edges[-1]):
            first = bisect_right(edges, starts_at) - 1
            last = bisect_left(edges, ends_at) - 1
            for m, n in enumerate(free):
                if last > first + 1:
                    steps[m][first + 1] += n
                    steps[m][last] -= n
                for i in (first, last):
                    shared[m, i] = min(shared.get((m, i), n), n)
        for (m, i), n in shared.items():
            steps[m][i] += n
            steps[m][i + 1] -= n

    def counts(self) -> dict[str, list[int]]:
        return {model: list(accumulate(steps[:-1])) for model, steps in sorted(self.steps.items())}


def _free_spans(ledger: Ledger, models: list[str], start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime, tuple[int, ...]]]:
    """[start, end) cut wherever a claim starts or ends, each span with the node's free
    GPUs per model (in the order of `models`): those no claim holds, at most the node's
    free count, as a pinned claim needs both (Ledger.fit)."""
    ledger = by_index(ledger)
    total = ledger.total
    position = {model: m for m, model in enumerate(models)}
    of_model = [0] * len(models)
    models_at: dict[int, list[int]] = {}  # GPU index -> the models of the GPUs of that index
    for device in ledger.info.devices:
        of_model[position[device.name]] += 1
        models_at.setdefault(device.index, []).append(position[device.name])
    pinned = [{int(i) for i in claim.device_ids} for claim in ledger.claims]
    inside = {t for c in ledger.claims for t in (c.starts_at, c.ends_at) if t is not None and start < t < end}
    points = [start, *sorted(inside), end]
    for a, b in zip(points, points[1:], strict=False):
        if not a < b:
            continue
        in_force = [(c, held) for c, held in zip(ledger.claims, pinned, strict=True) if c.in_force(a)]
        if any(c.all for c, _ in in_force):
            free = 0
            held_gpus: set[int] = set()
        else:
            held_gpus = set().union(*(held for _, held in in_force))
            counted = sum(c.count for c, _ in in_force if not c.device_ids and c.count > 0)
            free = total - min(total, len(held_gpus) + counted)
        if free < 1:
            yield a, b, (0,) * len(models)
            continue
        unheld = list(of_model)
        for index in held_gpus:
            for m in models_at.get(index, ()):
                unheld[m] -= 1
        yield a, b, tuple(min(free, n) for n in unheld)


# --- find a slot -------------------------------------------------------------------


@dataclass(frozen=True)
class SlotRequest:
    """`count` GPUs of one node for `duration`, starting at `after` or later; of a model
    (a case-insensitive part of the GPU's name) and each with `min_vram_mib` of memory:
    a booked GPU is the booking's whole, so its memory is its total."""

    after: datetime
    duration: timedelta
    count: int = 1
    model: str = ""
    min_vram_mib: int = 0


@dataclass(frozen=True)
class Slot:
    node: str
    gpus: tuple[Device, ...]
    starts_at: datetime
    ends_at: datetime
    left_over: int  # free GPUs the node keeps beside it, at the fewest

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(d.uuid for d in self.gpus)


def earliest_slot(name: str, ledger: Ledger, request: SlotRequest) -> Slot | None:
    """The earliest window on this node, or None when none ever fits. Only `after` and
    the ends of claims need trying: a window that fits can move earlier until it meets
    one of them without meeting any claim it did not meet before."""
    wanted = [d for d in ledger.info.devices if is_model(d, request.model) and _has_memory(d, request.min_vram_mib)]
    if request.count < 1 or len(wanted) < request.count:
        return None
    ledger = by_index(ledger)
    ends = {c.ends_at for c in ledger.claims if c.ends_at is not None and c.ends_at > request.after}
    for start in [request.after, *sorted(ends)]:
        window = Claim(PROBE, starts_at=start, ends_at=start + request.duration)
        meeting = [c for c in ledger.claims if c.overlaps(window)]
        held = {i for c in meeting for i in (range(ledger.total) if c.all else ledger.pinned(c))}
        unheld = [d for d in wanted if d.index not in held]
        if len(unheld) < request.count:
            continue
        gpus = tuple(unheld[: request.count])
        # Named by index, which the ledger resolves quicker than a UUID; the slot names them by UUID.
        probe = Claim(PROBE, device_ids=tuple(str(d.index) for d in gpus), starts_at=window.starts_at, ends_at=window.ends_at)
        error = Ledger(ledger.info, meeting).fit(probe)
        if error is None:
            left = min(p.ledger.free for p in pieces(Ledger(ledger.info, meeting), window.starts_at, window.ends_at))
            return Slot(name, gpus, window.starts_at, window.ends_at, left - request.count)
        if error.code in ("no_gpu", "runtime_missing"):
            return None
    return None


def find_slots(request: SlotRequest, candidates: Iterable[Candidate], limit: int) -> list[Slot]:
    """Each open node's earliest slot, best first: earliest, then the fewest GPUs left
    over (the fleet stays packed), then by name; the first `limit`."""
    slots = []
    for candidate in candidates:
        if candidate.closed() is None:
            slot = earliest_slot(candidate.name, candidate.ledger, request)
            if slot is not None:
                slots.append(slot)
    slots.sort(key=lambda s: (s.starts_at, s.left_over, s.node))
    return slots[:limit]


def _has_memory(device: Device, min_vram_mib: int) -> bool:
    return min_vram_mib <= 0 or (device.vram_total_mib or 0) >= min_vram_mib
