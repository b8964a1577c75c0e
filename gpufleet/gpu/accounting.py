"""Usage accounting: what one snapshot of a node says about who held and who used
its GPUs for the interval it covers. Pure: the centre stores the lines
(gpufleet/usage/) and adds them up over time.

Each GPU of the snapshot is given to at most one claim. One that pins it, or takes
every GPU, holds it. A claim for a count of GPUs holds no particular GPU, so for
accounting it is given unpinned ones, up to its count (oldest claim first): first
those busy with a container labelled with its name; then busy ones no claim's label
names, only as many as are more than the other count claims still want (work that may
be theirs is not its own); then idle ones; then any busy ones left. So a count claim's
reserved hours are its count, and its used hours are the work that can only be its own.

A GPU's interval is then split evenly among the containers on it (those running a
process there when it is busy, those attached to it when it is not; a process
outside any container counts as one with no image), so every line is a share of
GPU time and the lines of a snapshot add up to its GPU count times the interval."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.gpu.devices import Device
from gpufleet.gpu.ledger import Claim, Ledger, containers_on
from gpufleet.gpu.usage import IdleRule


@dataclass(frozen=True)
class Key:
    """What a share of GPU time is counted under. `claim` is the position of the
    holding claim in the claims given to `account` (None: no claim holds the GPU)."""

    claim: int | None
    model: str
    image: str = ""
    label: str = ""


@dataclass
class Seconds:
    """GPU-seconds of one key: seen (the snapshot covered them), used (busy), and of
    those seen, power_known with the energy they drew (watt-hours)."""

    seen: float = 0.0
    used: float = 0.0
    power_known: float = 0.0
    energy_wh: float = 0.0

    def add(self, seconds: float, busy: bool, power_w: float | None) -> None:
        self.seen += seconds
        if busy:
            self.used += seconds
        if power_w is not None:
            self.power_known += seconds
            self.energy_wh += power_w * seconds / 3600.0


def holders(ledger: Ledger, rule: IdleRule) -> dict[int, int]:
    """The claim (its position in ledger.claims) that holds each GPU for accounting,
    by GPU index; GPUs no claim holds are left out."""
    claims = ledger.claims
    held: dict[int, int] = {}
    every = next((i for i, c in enumerate(claims) if c.all), None)
    for device in ledger.info.devices:
        if every is not None:
            held[device.index] = every
            continue
        for position, claim in enumerate(claims):
            if claim.device_ids and device.index in ledger.pinned(claim):
                held[device.index] = position
                break
    if every is not None:
        return held
    counts = [(i, c) for i, c in enumerate(claims) if not c.device_ids and c.count > 0]
    if not counts:
        return held
    free = [d for d in ledger.info.devices if d.index not in held]
    wanted = {position: claim.count for position, claim in counts}

    def give(devices: Iterable[Device], position: int) -> None:
        for device in devices:
            if wanted[position] <= 0:
                return
            if device.index not in held:
                held[device.index] = position
                wanted[position] -= 1

    busy = [d for d in free if rule.busy(d)]
    for position, claim in counts:  # labelled for this claim first
        give((d for d in busy if claim.name.lower() in _labels(d)), position)
    names = {c.name.lower() for c in claims}
    unlabelled = [d for d in busy if d.index not in held and not _labels(d) & names]
    # Each is given the unlabelled work beyond what all the others still want, from one
    # reading of the wants, so the order of the claims does not decide whose it is.
    spare = len(unlabelled) - sum(wanted.values())
    shares = {position: max(0, want + spare) for position, want in wanted.items()}
    for position, share in shares.items():
        taken = unlabelled[:min(share, wanted[position])]
        give(taken, position)
        unlabelled = unlabelled[len(taken):]
    for position, _ in counts:
        give((d for d in free if not rule.busy(d)), position)
    for position, _ in counts:
        give(free, position)
    return held


def idle_claims(
    ledger: Ledger, quiet_since: Mapping[int, datetime], started: Sequence[datetime], cutoff: datetime,
    rule: IdleRule, booked: Sequence[bool] = (), at: datetime | None = None,
) -> list[tuple[Claim, tuple[int, ...], datetime]]:
    """The claims that did no work since `cutoff`, each with the GPUs that decided it and
    since when it has been idle: the later of its start (`started`, by position in
    ledger.claims) and the last work on those GPUs (`quiet_since`: since when each GPU,
    by index, did none). A pinned claim is judged by the GPUs it pins, one taking every
    GPU by all of them, a count by the unpinned GPUs but those busy with another claim's
    work: given to it (see `holders`) or labelled with its name. A claim left with no GPU
    on the node is not idle (its GPUs are missing, which is flagged apart).

    A booking (`booked`, by position: made before its start) that did no work since its
    start is idle, a no-show, once rule.no_show_hours have passed since it started, at `at`."""
    held = holders(ledger, rule)
    names = {c.name.lower() for c in ledger.claims}
    pinned_anywhere = {index for c in ledger.claims for index in ledger.pinned(c)}
    devices = ledger.info.devices
    no_show_cutoff = at - timedelta(hours=rule.no_show_hours) if at is not None and rule.no_show_hours else None
    found = []
    for position, claim in enumerate(ledger.claims):
        if claim.device_ids:
            judged = tuple(sorted(ledger.pinned(claim)))
        elif claim.all:
            judged = tuple(d.index for d in devices)
        else:
            others = names - {claim.name.lower()}
            judged = tuple(d.index for d in devices if d.index not in pinned_anywhere and not (
                rule.busy(d) and (held.get(d.index, position) != position or _labels(d) & others)))
        if not judged:
            continue
        since = max(started[position], *(quiet_since[i] for i in judged))
        no_show = (no_show_cutoff is not None and position < len(booked) and booked[position]
                   and since == started[position] and since <= no_show_cutoff)
        if since <= cutoff or no_show:
            found.append((claim, judged, since))
    return found


def account(ledger: Ledger, seconds: float, rule: IdleRule) -> dict[Key, Seconds]:
    """The snapshot's GPU-seconds by key, for an interval of `seconds` (the ledger's
    info is the snapshot's GPUs, its claims the node's)."""
    held = holders(ledger, rule)
    lines: dict[Key, Seconds] = {}
    for device in ledger.info.devices:
        busy = rule.busy(device)
        claim = held.get(device.index)
        sharers = _sharers(device, busy)
        share = seconds / len(sharers)
        for image, label in sharers:
            key = Key(claim, device.name, image, label)
            lines.setdefault(key, Seconds()).add(share, busy, device.power_draw_w)
    return lines


def _sharers(device: Device, busy: bool) -> Sequence[tuple[str, str]]:
    """(image, claim label) of each container sharing the GPU's time: those running a
    process on it (a process outside any container as ("", "")), or when it is idle
    those attached to it; ("", "") alone when there are none."""
    if device.processes:
        found = [(p.container.image, p.container.claim or "") if p.container else ("", "") for p in device.processes]
        by_container = {p.container.id: pair for p, pair in zip(device.processes, found, strict=True) if p.container}
        outside = [("", "")] if any(p.container is None for p in device.processes) else []
        return list(by_container.values()) + outside
    if device.attached_idle and not busy:
        return list({c.id: (c.image, c.claim or "") for c in device.attached_idle}.values())
    return [("", "")]


def _labels(device: Device) -> set[str]:
    return {c.claim.lower() for c in containers_on(device) if c.claim}

