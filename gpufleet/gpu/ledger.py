"""The claims ledger: which GPUs of one node are spoken for, and when.

A claim holds its GPUs over its window, the half-open interval [starts_at, ends_at).
Docker does not enforce exclusivity, so this is scheduling accounting, not isolation.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpufleet.gpu.devices import Device, Info, uuid_key
from gpufleet.gpu.processes import Container


@dataclass(frozen=True)
class Claim:
    """One workload's GPU reservation. With device ids it pins those GPUs (count is then
    ignored); without, count <= 0 means every GPU, as Docker's `--gpus all` does.
    It holds them from `starts_at` until before `ends_at`; None at either end is unbounded."""

    name: str
    count: int = 0
    device_ids: tuple[str, ...] = ()
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    team: str = ""  # whose claim it is, for the sentences that name it in another team's way

    def __post_init__(self) -> None:
        # Callers pass lists from forms and JSON; keep the claim hashable.
        object.__setattr__(self, "device_ids", tuple(self.device_ids))

    @property
    def all(self) -> bool:
        """Whether the claim takes every GPU on the node."""
        return not self.device_ids and self.count <= 0

    def in_force(self, moment: datetime | None) -> bool:
        """Whether the claim holds its GPUs at `moment` (None: before any time)."""
        started = self.starts_at is None or (moment is not None and self.starts_at <= moment)
        return started and (self.ends_at is None or moment is None or moment < self.ends_at)

    def overlaps(self, other: Claim) -> bool:
        """Whether the two windows share an instant (an empty window has none)."""
        return (_before(self.starts_at, other.ends_at) and _before(other.starts_at, self.ends_at)
                and _before(self.starts_at, self.ends_at) and _before(other.starts_at, other.ends_at))

    def named_for(self, asker: Claim) -> str:
        """"train-llm (team vision)" to a claim of another team; the name alone to one of
        the same team (or where either has none), which needs no telling whose it is."""
        return f"{self.name} (team {self.team})" if self.team and asker.team and self.team != asker.team else self.name

    def window(self) -> str:
        """"from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC", in the times' own zone."""
        if self.starts_at is None and self.ends_at is None:
            return "at any time"
        if self.ends_at is None:
            return f"from {moment_text(self.starts_at)}, with no end"
        if self.starts_at is None:
            return f"until {moment_text(self.ends_at)}"
        return f"from {moment_text(self.starts_at, zone=False)} to {moment_text(self.ends_at)}"


def _before(start: datetime | None, end: datetime | None) -> bool:
    """start < end, where a start of None is before all time and an end of None after it."""
    return start is None or end is None or start < end


def moment_text(moment: datetime, zone: bool = True) -> str:
    text = f"{moment:%a} {moment.day} {moment:%b %H:%M}"
    name = moment.tzname() if zone else None
    return f"{text} {name}" if name else text


class FitError(Exception):
    """Why a claim does not fit a node. `code` is stable for machines; str() is for people.
    `ends_by`: the claim would fit if it ended by then (what is in its way starts later)."""

    code = "fit_error"
    ends_by: datetime | None = None

    def offer(self, ends_by: datetime | None) -> FitError:
        if ends_by is not None:
            self.ends_by = ends_by
            self.args = (f"{self.args[0]}; it fits if it ends by {moment_text(ends_by)}",)
        return self


class NoGPU(FitError):
    code = "no_gpu"

    def __init__(self) -> None:
        super().__init__("the node reports no NVIDIA GPU")


class RuntimeMissing(FitError):
    code = "runtime_missing"

    def __init__(self) -> None:
        super().__init__(
            "the node's GPUs cannot be attached to containers:"
            " Docker has neither the nvidia runtime nor NVIDIA CDI devices"
        )


# How much of a device id a message repeats: ids come from people and scripts, and a
# message is shown and logged, so a megabyte of id must not become a megabyte of page.
SHOWN_ID_MAX = 80


def _shown(device_id: str) -> str:
    if len(device_id) <= SHOWN_ID_MAX:
        return repr(device_id)
    return repr(device_id[:SHOWN_ID_MAX]) + f"… ({len(device_id)} characters)"


class UnknownDevice(FitError):
    code = "unknown_device"

    def __init__(self, device_id: str) -> None:
        super().__init__(f"GPU {_shown(device_id)} is not present on the node")
        self.device_id = device_id


class DuplicateDevice(FitError):
    code = "duplicate_device"

    def __init__(self, device_id: str, index: int) -> None:
        super().__init__(
            f"GPU {_shown(device_id)} names GPU {index}, which the claim already names"
        )
        self.device_id = device_id
        self.index = index


class DeviceTaken(FitError):
    code = "device_taken"

    def __init__(self, device_id: str, index: int, holder: str, window: str = "") -> None:
        super().__init__(f"GPU {index} ({device_id!r}) is already reserved by {holder}{_spaced(window)}")
        self.device_id = device_id
        self.index = index
        self.holder = holder


class Insufficient(FitError):
    """Not enough free GPUs. `holders` is set when an all-GPU claim met reservations;
    `shown` names them (or, for a count, the claims then in force) with their windows
    where those limit the conflict, and `when` says when, if later than the claim starts."""

    code = "insufficient"

    def __init__(
        self, need: int, free: int, total: int, holders: tuple[str, ...] = (),
        shown: tuple[str, ...] = (), when: str = "",
    ) -> None:
        if holders:
            reserved = total - free
            message = (
                f"needs every GPU but {reserved} of {total}"
                f" {'is' if reserved == 1 else 'are'} reserved{_spaced(when)} by {', '.join(shown or holders)}"
            )
        else:
            message = f"needs {_gpus(need)} but only {free} of {total} {'is' if free == 1 else 'are'} free{_spaced(when)}"
            if shown:
                message += f" beside {', '.join(shown)}"
        super().__init__(message)
        self.need = need
        self.free = free
        self.total = total
        self.holders = holders


def _spaced(text: str) -> str:
    return f" {text}" if text else ""


def _gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def _limits(other: Claim, claim: Claim) -> str:
    """`other`'s window, when it bounds the conflict with `claim`: it ends, or starts
    after `claim` does; "" for a claim that holds on from before `claim` with no end."""
    starts_later = other.starts_at is not None and (claim.starts_at is None or other.starts_at > claim.starts_at)
    return other.window() if other.ends_at is not None or starts_later else ""


def _with_windows(held: Ledger, claim: Claim) -> tuple[str, ...]:
    """The claims `held`, each with its team and, where that bounds the conflict, its
    window; () when none has either (the names alone say it)."""
    windows = {c.named_for(claim): _limits(c, claim) for c in held.claims}
    if not any(windows.values()) and all(name in held.holders for name in windows):
        return ()
    return tuple(f"{name} ({windows[name]})" if windows[name] else name for name in sorted(windows))


def containers_on(device: Device) -> list[Container]:
    """The containers on a GPU: those of its processes, then those attached to it idle."""
    return [p.container for p in device.processes if p.container is not None] + list(device.attached_idle)


def in_use(device: Device) -> bool:
    """Whether something holds the GPU now: a compute process on it, or a container it
    was given (attached, even idle)."""
    return bool(device.processes or device.attached_idle)


class Ledger:
    """The reservations on one node.

    `reserved`, `free`, `holders`, `holder_of` and the use checks read the claims given as
    held together: give them the claims in force now. `fit` reads the claims' windows: to
    validate an edit, build the ledger from every *other* claim whose window may meet the
    edited one's and fit it: `Ledger(info, other_claims).fit(edited)`.
    """

    def __init__(self, info: Info, claims: Iterable[Claim]) -> None:
        self.info = info
        self.claims = tuple(claims)

    def resolve(self, device_id: str) -> Device | None:
        """The device an id names: its index ("3"), its UUID or the UUID of one of its
        MIG slices (any case), trimmed. A slice resolves to its GPU: the ledger books
        whole GPUs, so a claim on a slice holds the GPU it is cut from."""
        wanted = uuid_key(device_id)
        for device in self.info.devices:
            if wanted.isascii() and wanted.isdigit():
                if device.index == int(wanted):
                    return device
            elif wanted in (uuid_key(device.uuid), *(uuid_key(m.uuid) for m in device.mig_devices)):
                return device
        return None

    @property
    def total(self) -> int:
        """The node's GPU count."""
        return self.info.count if self.info.present else 0

    @property
    def reserved(self) -> int:
        """How many GPUs are spoken for, never above total."""
        if any(c.all for c in self.claims):
            return self.total
        pinned = {index for c in self.claims for index in self.pinned(c)}
        return min(self.total, len(pinned) + self._counted())

    @property
    def free(self) -> int:
        return self.total - self.reserved

    @property
    def holders(self) -> list[str]:
        """The workloads holding a reservation, sorted."""
        return sorted({c.name for c in self.claims})

    def holder_of(self, device_index: int) -> str | None:
        """The claim holding that GPU by pinning it or by taking every GPU; None when
        it is free or only covered by a count (counts hold no particular GPU)."""
        holding = self.holding(device_index)
        return holding.name if holding is not None else None

    def holding(self, device_index: int) -> Claim | None:
        """`holder_of`'s claim itself."""
        for claim in self.claims:
            if claim.all or device_index in self.pinned(claim):
                return claim
        return None

    def fit(self, claim: Claim) -> FitError | None:
        """Why `claim` cannot be placed on this node over its window, or None when it can.

        Reasons, first one wins: no GPU; GPUs cannot be attached; unknown device; a
        device named twice; then, at the first instant of the window where it fails:
        an all-GPU claim while anything is reserved, a device held by another claim,
        not enough free GPUs. The claims in force only change where a window starts or
        ends, so those instants are the only ones to check.
        """
        if not self.info.present or self.total == 0:
            return NoGPU()
        if not self.info.usable:
            return RuntimeMissing()
        named: dict[int, str] = {}  # index -> the id that named it
        for device_id in claim.device_ids:
            device = self.resolve(device_id)
            if device is None:
                return UnknownDevice(device_id)
            if device.index in named:
                return DuplicateDevice(device_id, device.index)
            named[device.index] = device_id
        others = [c for c in self.claims if c.overlaps(claim)]
        inside = {t for c in others for t in (c.starts_at, c.ends_at)
                  if t is not None and _before(claim.starts_at, t) and _before(t, claim.ends_at)}
        for moment in [claim.starts_at, *sorted(inside)]:
            error = self._fit_at(claim, named, Ledger(self.info, [c for c in others if c.in_force(moment)]), moment)
            if error is not None:
                later = moment is not None and moment != claim.starts_at
                return error.offer(moment if later else None)
        return None

    def _fit_at(self, claim: Claim, named: dict[int, str], held: Ledger, moment: datetime | None) -> FitError | None:
        """`fit` at one instant, beside the claims `held` then."""
        when = f"from {moment_text(moment)}" if moment is not None and moment != claim.starts_at else ""
        if claim.all:
            if held.reserved > 0:
                return Insufficient(self.total, held.free, self.total, tuple(held.holders), _with_windows(held, claim), when)
            return None
        for index, device_id in named.items():
            holding = held.holding(index)
            if holding is not None:
                return DeviceTaken(device_id, index, holding.named_for(claim), _limits(holding, claim))
        need = len(named) if named else claim.count
        # A pinned claim needs free GPUs too: counted claims may already use up the rest.
        if need > held.free:
            return Insufficient(need, held.free, self.total, shown=_with_windows(held, claim), when=when)
        return None

    def overlaps(self) -> list[tuple[Claim, FitError]]:
        """Claims that no longer fit beside the ones before them (in the given order,
        oldest first): two claims holding one GPU, or more GPUs held than the node has.
        It happens when a vanished GPU returns to an "all GPUs" claim and a pinned one."""
        found = []
        for position, claim in enumerate(self.claims):
            error = Ledger(self.info, self.claims[:position]).fit(claim)
            if isinstance(error, (DeviceTaken, Insufficient)):
                found.append((claim, error))
        return found

    def unclaimed_use(self) -> list[Device]:
        """GPUs with processes or attached containers that the claims do not account for: the busy
        GPUs no claim pins or takes whole, when there are more of them than the
        counted claims cover (a count holds no particular GPU, so it covers any)."""
        busy = self._busy_unheld()
        return busy if len(busy) > self._counted() else []

    @property
    def busy_unclaimed(self) -> int:
        """How many GPUs are busy (a process, or a container attached) beyond what the
        claims account for: the busy GPUs no claim pins or takes whole, less those the
        counted claims cover. Not free for new work, though a claim may still take them."""
        return max(0, len(self._busy_unheld()) - self._counted())

    def _busy_unheld(self) -> list[Device]:
        return [d for d in self.info.devices if in_use(d) and self.holder_of(d.index) is None]

    def _counted(self) -> int:
        return sum(c.count for c in self.claims if not c.device_ids and c.count > 0)

    def misplaced(self) -> list[tuple[Device, Container, str]]:
        """Containers on a GPU (running a process there, or attached idle) whose
        label gpufleet.claim names a claim that does not hold that GPU, with why: no
        such claim on this node, the claim pins other GPUs, or another claim holds it."""
        by_name = {c.name.lower(): c for c in self.claims}
        found = []
        for device in self.info.devices:
            if not device.processes and not device.attached_idle:
                continue  # most GPUs: no container to judge
            for container in dict.fromkeys(c for c in containers_on(device) if c.claim):
                claim = by_name.get(container.claim.lower())
                holder = self.holder_of(device.index)
                if claim is None:
                    found.append((device, container, f"no claim named {container.claim!r} on this node"))
                elif claim.device_ids and device.index not in self.pinned(claim):
                    found.append((device, container, f"claim {claim.name!r} holds other GPUs"))
                elif not claim.all and holder is not None and holder != claim.name:
                    found.append((device, container, f"GPU {device.index} is held by {holder!r}"))
        return found

    def pinned(self, claim: Claim) -> set[int]:
        """Indexes of the GPUs a claim pins; ids no longer on the node pin nothing."""
        indexes = set()
        for device_id in claim.device_ids:
            device = self.resolve(device_id)
            if device is not None:
                indexes.add(device.index)
        return indexes
