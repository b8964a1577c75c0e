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
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

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


def free_of(ledger: Ledger, devices: Iterable[Device]) -> list[Device]:
    """Those of `devices` that a claim pinning them could take beside the ledger's claims."""
    if ledger.free < 1:
        return []
    return [d for d in devices if ledger.holding(d.index) is None]


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


def free_by_model(ledger: Ledger, edges: list[datetime]) -> dict[str, list[int]]:
    """For each GPU model of the node, how many of its GPUs are free throughout each
    bucket [edges[i], edges[i+1]): the fewest free at any instant of it."""
    models = sorted({d.name for d in ledger.info.devices})
    counts = {m: [-1] * (len(edges) - 1) for m in models}
    if not models or len(edges) < 2:
        return counts
    for piece in pieces(by_index(ledger), edges[0], edges[-1]):
        free = _free_per_model(piece.ledger, models)
        # The buckets the piece meets: those between its first and last wholly inside it
        # (no other piece meets them), the first and last perhaps shared.
        first = bisect_right(edges, piece.starts_at) - 1
        last = bisect_left(edges, piece.ends_at) - 1
        for m, row in counts.items():
            if last > first + 1:
                row[first + 1:last] = [free[m]] * (last - first - 1)
            for i in (first, last):
                row[i] = free[m] if row[i] < 0 else min(row[i], free[m])
    return counts


def _free_per_model(ledger: Ledger, models: list[str]) -> dict[str, int]:
    free = free_of(ledger, ledger.info.devices)
    # A pinned claim needs the node's free count as well as unheld GPUs (Ledger.fit).
    return {m: min(ledger.free, sum(1 for d in free if d.name == m)) for m in models}


def fleet_free_by_model(candidates: Iterable[Candidate], edges: list[datetime]) -> dict[str, list[int]]:
    """`free_by_model` summed over the nodes that take new work (Candidate.closed), by model."""
    # Most nodes' counts repeat another's (no claim in the days shown): each is summed once.
    seen: Counter[tuple[str, tuple[int, ...]]] = Counter()
    for candidate in candidates:
        if candidate.closed() is None:
            seen.update((model, tuple(counts)) for model, counts in free_by_model(candidate.ledger, edges).items())
    total: dict[str, list[int]] = {}
    for (model, counts), nodes in seen.items():
        sums = total.setdefault(model, [0] * len(counts))
        for i, n in enumerate(counts):
            sums[i] += n * nodes
    return dict(sorted(total.items()))


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
