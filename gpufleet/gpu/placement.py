"""Where a claim of N GPUs could go now, fleet-wide.

Whether a claim fits one node is the ledger's call (`Ledger.fit`); this only asks
each candidate node's ledger about a hypothetical claim, rules out the nodes that
cannot take work (offline, in maintenance, failing, stale) and ranks the ones where it fits.
A GPU busy with work no claim holds (`Ledger.busy_unclaimed`) is not offered: the
ledger would book it, but new work there would share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpufleet.gpu.devices import Device
from gpufleet.gpu.ledger import Claim, Insufficient, Ledger, in_use

# The name of the hypothetical claim; never stored.
PROBE = "placement"

OFFLINE = "offline"
MAINTENANCE = "maintenance"
VALIDATION = "validation"
FAILING = "failing"
STALE = "stale"
TOO_FEW = "too_few"
NO_MODEL = "no_model"
LOW_VRAM = "low_vram"
# Each reason in a few words, for counts by reason; the ledger's own codes too.
PLACEMENT_REASONS = {
    OFFLINE: "offline",
    MAINTENANCE: "in maintenance",
    VALIDATION: "in validation",
    FAILING: "failing",
    STALE: "stale",
    TOO_FEW: "too few free GPUs",
    NO_MODEL: "no GPU of that model",
    LOW_VRAM: "not enough free VRAM",
    "no_gpu": "no GPU",
    "runtime_missing": "GPUs not attachable",
}


@dataclass(frozen=True)
class PlacementRequest:
    """What is wanted: `count` GPUs (0 means every GPU of one node), optionally of a
    model (a case-insensitive part of the GPU's name) and each with at least
    `min_free_vram_mib` free."""

    count: int = 1
    model: str = ""
    min_free_vram_mib: int = 0

    @property
    def all(self) -> bool:
        return self.count <= 0


@dataclass(frozen=True)
class Candidate:
    """One node as placement sees it: its ledger and whether it can take work."""

    name: str
    ledger: Ledger
    offline: bool = False
    maintenance: bool = False
    validation: bool = False  # no new claim until a DCGM diagnostic passes
    failing: bool = False
    stale: bool = False


@dataclass(frozen=True)
class Fit:
    name: str
    gpus: int  # how many GPUs the claim would take
    left_over: int  # free GPUs the node keeps after it
    free_vram_mib: int  # free VRAM on the GPUs it would likely get
    # The GPUs (UUIDs) to pin when only some GPUs of the node will do (a model or a
    # VRAM minimum was asked); empty when any free GPU will do.
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuledOut:
    name: str
    code: str
    reason: str


@dataclass
class Placement:
    """Fits best first (fewest GPUs left over, then most free VRAM, then name);
    the others with why, in name order."""

    fits: list[Fit] = field(default_factory=list)
    ruled_out: list[RuledOut] = field(default_factory=list)

    def ruled_out_counts(self) -> dict[str, int]:
        """How many nodes each reason rules out, most first: for fleets too big to list."""
        return dict(Counter(r.code for r in self.ruled_out).most_common())


def place(request: PlacementRequest, candidates: Iterable[Candidate]) -> Placement:
    placement = Placement()
    for candidate in candidates:
        outcome = _try(request, candidate)
        if isinstance(outcome, Fit):
            placement.fits.append(outcome)
        else:
            placement.ruled_out.append(outcome)
    placement.fits.sort(key=lambda f: (f.left_over, -f.free_vram_mib, f.name))
    placement.ruled_out.sort(key=lambda r: r.name)
    return placement


def free_vram_mib(device: Device) -> int | None:
    """Free VRAM of one GPU; None when it reports no memory figures."""
    if device.vram_total_mib is None or device.vram_used_mib is None:
        return None
    return max(0, device.vram_total_mib - device.vram_used_mib)


def _try(request: PlacementRequest, candidate: Candidate) -> Fit | RuledOut:
    name = candidate.name
    if candidate.offline:
        return RuledOut(name, OFFLINE, "offline")
    if candidate.maintenance:
        return RuledOut(name, MAINTENANCE, "in maintenance")
    if candidate.validation:
        return RuledOut(name, VALIDATION, "in validation until a DCGM diagnostic passes")
    if candidate.failing:
        return RuledOut(name, FAILING, "failing")
    if candidate.stale:
        return RuledOut(name, STALE, "stale: it missed its last reports")
    ledger = candidate.ledger
    devices = ledger.info.devices
    of_model = [d for d in devices if is_model(d, request.model)]
    roomy = [d for d in of_model if _has_room(d, request.min_free_vram_mib)]
    if request.all:
        if devices and not of_model:
            return RuledOut(name, NO_MODEL, f"no GPU of model {request.model!r}")
        if len(of_model) < len(devices):
            return RuledOut(name, NO_MODEL, f"not every GPU is of model {request.model!r}")
        if len(roomy) < len(devices):
            return RuledOut(name, LOW_VRAM, "not enough free VRAM on every GPU")
        probe = Claim(PROBE, count=0)
        wanted = list(devices)
    elif request.model or request.min_free_vram_mib:
        # Only some GPUs will do, so ask the ledger about those GPUs by name.
        if devices and not of_model:
            return RuledOut(name, NO_MODEL, f"no GPU of model {request.model!r}")
        unpinned = [d for d in roomy if ledger.holder_of(d.index) is None and not in_use(d)]
        if devices and not roomy:
            return RuledOut(name, LOW_VRAM, f"not enough free VRAM: no GPU has {_gib(request.min_free_vram_mib)} GiB free")
        wanted = sorted(unpinned, key=lambda d: -(free_vram_mib(d) or 0))[: request.count]
        if devices and len(wanted) < request.count:
            return _too_few(name, min(len(unpinned), _free(ledger)), len(devices), ledger.busy_unclaimed)
        probe = Claim(PROBE, device_ids=tuple(d.uuid for d in wanted))
    else:
        probe = Claim(PROBE, count=request.count)
        unpinned = [d for d in devices if ledger.holder_of(d.index) is None and not in_use(d)]
        wanted = sorted(unpinned, key=lambda d: -(free_vram_mib(d) or 0))[: request.count]
    error = ledger.fit(probe)
    busy = ledger.busy_unclaimed
    if isinstance(error, Insufficient):
        return _too_few(name, max(0, error.free - busy), error.total, busy)
    if error is not None:
        return RuledOut(name, error.code, str(error))
    gpus = ledger.total if request.all else request.count
    if gpus > _free(ledger):
        return _too_few(name, _free(ledger), ledger.total, busy)
    return Fit(name, gpus, _free(ledger) - gpus, sum(free_vram_mib(d) or 0 for d in wanted), probe.device_ids)


def _free(ledger: Ledger) -> int:
    """The GPUs new work may take: free in the ledger and not busy with unclaimed work."""
    return max(0, ledger.free - ledger.busy_unclaimed)


def _gib(mib: int) -> str:
    """In GiB, the unit people ask in (the find-a-node form): 40960 -> "40", 81408 -> "79.5"."""
    return f"{round(mib / 1024, 1):g}"


def _too_few(name: str, free: int, total: int, busy: int = 0) -> RuledOut:
    more = f", {busy} busy with work no claim holds" if busy else ""
    return RuledOut(name, TOO_FEW, f"too few free GPUs ({free} free of {total}{more})")


def is_model(device: Device, model: str) -> bool:
    """Whether the GPU's name holds `model` (any case); "" is every model."""
    return model.strip().lower() in device.name.lower()


def _has_room(device: Device, min_free_vram_mib: int) -> bool:
    if min_free_vram_mib <= 0:
        return True
    free = free_vram_mib(device)
    return free is not None and free >= min_free_vram_mib
