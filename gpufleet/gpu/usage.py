"""Claims against real use: what the ledger says is held, beside the processes and
containers the agent found on each GPU. The centre adds these findings at ingest,
where it has both the snapshot and the node's claims."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpufleet.gpu.devices import Device
from gpufleet.gpu.findings import Finding, Status
from gpufleet.gpu.ledger import Claim, Ledger
from gpufleet.gpu.processes import CLAIM_LABEL, GpuProcess

# A finding names at most this many GPUs or processes, then counts the rest.
_LISTED = 8
# The findings of claims against use, by code, with their names.
USE_KINDS = {
    "use-unclaimed": "Used but unclaimed",
    "attached-unclaimed": "Attached but unclaimed",
    "use-misplaced": "Running outside its claim",
    "claim-idle": "Claimed but idle",
}


@dataclass(frozen=True)
class IdleRule:
    """When a GPU counts as idle: no process on it and utilization under
    `util_percent`, snapshot after snapshot for `hours`. One quiet sample says
    nothing; the centre keeps, per GPU, when it last did work (see `busy`)."""

    util_percent: float = 5.0
    hours: float = 24.0
    # A booking that did no work since its start is idle this many hours after it (a
    # no-show, accounting.idle_claims); None: bookings wait for `hours` as any claim.
    no_show_hours: float | None = None

    def busy(self, device) -> bool:
        """Whether this one reading of the GPU (anything with `processes` and
        `utilization_percent`, as a Device has) shows work. A container attached to
        it without a process is not work: that is what an idle claim looks like."""
        utilization = device.utilization_percent
        return bool(device.processes) or (utilization is not None and utilization >= self.util_percent)


def claim_use_findings(
    ledger: Ledger, idle_claims: Iterable[tuple[Claim, tuple[int, ...], datetime]] = (), rule: IdleRule = IdleRule()
) -> list[Finding]:
    """"Used but unclaimed", "attached but unclaimed", "in the wrong place" and
    "claimed but idle" for one node (`idle_claims`: as accounting.idle_claims finds
    them); none when the claims and the work on the GPUs agree."""
    found = []
    unclaimed = ledger.unclaimed_use()
    # In use is what the rule calls work; a GPU that only has a container attached
    # is held (Docker gave it out) but not used: said apart, in those words.
    if in_use := [d for d in unclaimed if rule.busy(d)]:
        found.append(
            Finding(
                "use-unclaimed",
                USE_KINDS["use-unclaimed"],
                Status.WARN,
                f"{_count(len(in_use), 'GPU')} in use that no claim holds: "
                + _listed([f"GPU {d.index} ({_who(d)})" for d in in_use]),
                "Add a claim for the workload (or pin its GPUs in an existing claim), or stop it.",
            )
        )
    if attached := [d for d in unclaimed if not rule.busy(d)]:
        found.append(
            Finding(
                "attached-unclaimed",
                USE_KINDS["attached-unclaimed"],
                Status.WARN,
                f"{_count(len(attached), 'GPU')} with a container attached, idle, that no claim holds: "
                + _listed([f"GPU {d.index} ({_containers(d.attached_idle)})" for d in attached]),
                "Add a claim for the container's GPUs, or stop the container if it is not needed.",
            )
        )
    if misplaced := ledger.misplaced():
        found.append(
            Finding(
                "use-misplaced",
                USE_KINDS["use-misplaced"],
                Status.WARN,
                f"{_count(len(misplaced), 'container')} labelled {CLAIM_LABEL} on GPUs their claim"
                " does not hold: "
                + _listed([f"container {c.name} on GPU {d.index}: {why}" for d, c, why in misplaced]),
                "Start the container on its claim's GPUs (docker run --gpus '\"device=<ids>\"'), or edit the claim.",
            )
        )
    if idle_claims := list(idle_claims):
        found.append(
            Finding(
                "claim-idle",
                USE_KINDS["claim-idle"],
                Status.WARN,
                f"{_count(len(idle_claims), 'claim')} with no process and under {rule.util_percent:g}% utilization"
                f" on any of its GPUs for {rule.hours:g} h"
                + (f" (a booking: {rule.no_show_hours:g} h from its start)" if rule.no_show_hours else "") + ": "
                + _listed([f"{claim.name!r} ({_gpus(indexes)})" for claim, indexes, _ in idle_claims]),
                "Release the claim if its work is done (or shrink it), or find out why its workload is not running.",
            )
        )
    return found


def _gpus(indexes: tuple[int, ...]) -> str:
    return ("GPU " if len(indexes) == 1 else "GPUs ") + ", ".join(str(i) for i in indexes)


def _who(device: Device) -> str:
    names = dict.fromkeys(
        [_process(p) for p in device.processes] + [f"container {c.name}, attached, idle" for c in device.attached_idle]
    )
    return ", ".join(list(names)[:3]) + (" …" if len(names) > 3 else "")


def _containers(containers) -> str:
    names = list(dict.fromkeys(f"container {c.name}" for c in containers))
    return ", ".join(names[:3]) + (" …" if len(names) > 3 else "")


def _process(process: GpuProcess) -> str:
    if process.container is not None:
        return f"container {process.container.name}"
    return f"{process.name} (pid {process.pid})"


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - _LISTED} more" if len(items) > _LISTED else ""
    return "; ".join(items[:_LISTED]) + more


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"
