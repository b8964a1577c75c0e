"""Xid errors: what the NVIDIA kernel driver logs when a GPU misbehaves.

The agent reads the kernel log (`dmesg --time-format=iso`, through the Runner);
this module finds the Xid lines in it, whatever prefix the log tool put in front
(`dmesg`, `dmesg -T`, `dmesg --time-format=iso`, `journalctl -k`), counts them per
GPU within a window and says, from NVIDIA's public Xid catalogue, what each code
means and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.gpu.devices import Device, XidCount, pci_address
from gpufleet.gpu.interfaces import COMMAND_TIMEOUT_S, CommandResult, Runner

KERNEL_LOG_ARGV = ["dmesg", "--time-format=iso"]
DEFAULT_XID_WINDOW_HOURS = 24.0
# Newer drivers report a GPU that fell off the bus without an Xid; NVIDIA's code for it.
FALLEN_OFF_THE_BUS = 79

RESTART_APP = "Restart the application; if it recurs, debug it (compute-sanitizer) before suspecting the GPU."
RESET_GPU = "Drain the GPU and reset it (nvidia-smi -r -i <index>), or reboot the node."
REBOOT = "Drain the node and reboot it."
INSPECT = "Drain the node, reboot it, and if the error returns have the hardware inspected (RMA)."
LOST_GPU = ("Drain the node and try a GPU reset (nvidia-smi -r -i <index>); if the GPU stays lost, reboot,"
            " and if it is lost again have the hardware inspected (RMA).")


@dataclass(frozen=True)
class XidCode:
    """One catalogue entry. `fails` is False for errors an application causes."""

    description: str
    fails: bool
    action: str


# From NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors). Codes an
# application causes warn at most; codes that mean the GPU or its memory is in
# trouble fail, with the action NVIDIA documents.
XID_CATALOGUE: dict[int, XidCode] = {
    8: XidCode("GPU stopped processing (timeout)", False, RESTART_APP),
    13: XidCode("Graphics engine exception", False, RESTART_APP),
    31: XidCode("GPU memory page fault", False, RESTART_APP),
    32: XidCode("Invalid or corrupted push buffer stream", False, RESTART_APP),
    43: XidCode("GPU stopped processing", False, RESTART_APP),
    45: XidCode("Preemptive cleanup, due to previous errors", False, RESTART_APP),
    48: XidCode("Double bit ECC error", True, RESET_GPU),
    61: XidCode("Internal micro-controller breakpoint/warning", True, RESET_GPU),
    62: XidCode("Internal micro-controller halt", True, RESET_GPU),
    63: XidCode("ECC page retirement or row remapping recording event", True, RESET_GPU),
    64: XidCode("ECC page retirement or row remapper recording failure", True, INSPECT),
    68: XidCode("Video processor exception", False, RESTART_APP),
    69: XidCode("Graphics engine class error", False, RESTART_APP),
    74: XidCode("NVLink error", True, INSPECT),
    79: XidCode("GPU has fallen off the bus", True, INSPECT),
    92: XidCode("High single-bit ECC error rate", True, INSPECT),
    94: XidCode("Contained ECC error", True, RESET_GPU),
    95: XidCode("Uncontained ECC error", True, RESET_GPU),
    109: XidCode("Context switch timeout", False, RESTART_APP),
    119: XidCode("GSP RPC timeout", True, RESET_GPU),
    120: XidCode("GSP error", True, RESET_GPU),
    121: XidCode("C2C link error", True, INSPECT),
    140: XidCode("Unrecovered ECC error", True, RESET_GPU),
    143: XidCode("GPU initialization failure", True, INSPECT),
    154: XidCode("GPU recovery action changed", True, REBOOT),
}


def xid_code(xid: int) -> XidCode:
    return XID_CATALOGUE.get(
        xid, XidCode(f"Xid {xid} (not in gpufleet's catalogue)", False, "Look the code up in NVIDIA's Xid catalogue.")
    )


@dataclass(frozen=True)
class XidEvent:
    """One Xid the driver logged: the PCI address it named, the code, and when (None
    when the log's prefix carries no wall-clock time, e.g. plain dmesg's uptime)."""

    pci: str
    xid: int
    at: datetime | None
    text: str


# "NVRM: Xid (PCI:0000:9b:00): 119, pid=1234, name=python, Timeout ..." and the
# older "NVRM: Xid (0000:03:00): 14, Channel 00000001".
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})[^)]*\): (\d+),?\s*(.*)")
# Newer drivers say it without an Xid, over one or several lines:
# "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus." or
# "NVRM: The NVIDIA GPU 0000:b3:00.0" / "(PCI ID: 10de:2330) installed ..." / "fallen off the bus ...".
_NAMES_GPU = re.compile(
    r"NVRM: (?:GPU at PCI:|The NVIDIA GPU |GPU )([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
)
# How many lines after naming a GPU the driver's "fallen off the bus" may come.
_OFF_THE_BUS_LINES = 3
# The times log tools print in front of a kernel line.
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:[+-]\d{2}:?\d{2}|Z)?)\s")
_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d{1,2} \d{2}:\d{2}:\d{2} \d{4})\]")
_JOURNAL = re.compile(r"^(\w{3} \d{1,2} \d{2}:\d{2}:\d{2}) ")


def parse_kernel_log(text: str, now: datetime) -> list[XidEvent]:
    """Every Xid and fallen-off-the-bus report in `text`, oldest first. `now` gives
    the year and zone to journalctl's short times, which carry neither."""
    events: list[XidEvent] = []
    named, named_at = "", -_OFF_THE_BUS_LINES - 1
    for number, line in enumerate(text.splitlines()):
        if xid := _XID.search(line):
            event = XidEvent(xid.group(1).lower(), int(xid.group(2)), _line_time(line, now), xid.group(3).strip())
        else:
            if gpu := _NAMES_GPU.search(line):
                named, named_at = gpu.group(1).lower(), number
            if "fallen off the bus" not in line or not named or number - named_at > _OFF_THE_BUS_LINES:
                continue
            event = XidEvent(named, FALLEN_OFF_THE_BUS, _line_time(line, now), "GPU has fallen off the bus")
        # The driver reports one fall in several lines (and as Xid 79 too): count it once.
        # Other Xids repeat for real, within a second or on lines without a time.
        if event.xid == FALLEN_OFF_THE_BUS and events and (events[-1].pci, events[-1].xid, events[-1].at) == (
            event.pci, event.xid, event.at
        ):
            continue
        events.append(event)
    return events


def _line_time(line: str, now: datetime) -> datetime | None:
    try:
        if match := _ISO.match(line):
            value = datetime.fromisoformat(match.group(1).replace(",", "."))
        elif match := _CTIME.match(line):
            value = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif match := _JOURNAL.match(line):
            value = datetime.strptime(f"{now.year} {match.group(1)}", "%Y %b %d %H:%M:%S")
        else:
            return None
    except ValueError:
        return None
    if value.tzinfo is None:
        # dmesg -T and journalctl print local time; the agent's clock is the node's.
        value = value.replace(tzinfo=now.tzinfo)
    return value


def count_xids(
    events: Sequence[XidEvent], devices: Sequence[Device], now: datetime, window_hours: float
) -> tuple[dict[int, tuple[XidCount, ...]], list[XidEvent]]:
    """Xid counts per GPU index within the window, and the events naming no listed GPU.
    An event without a time counts: the log keeps only recent lines anyway."""
    since = now - timedelta(hours=window_hours)
    by_pci = {d.pci_address: d.index for d in devices if d.pci_address is not None}
    counts: dict[tuple[int, int], list] = {}
    unmatched: list[XidEvent] = []
    for event in events:
        if event.at is not None and event.at < since:
            continue
        index = by_pci.get(pci_address(event.pci))
        if index is None:
            unmatched.append(event)
            continue
        entry = counts.setdefault((index, event.xid), [0, None])
        entry[0] += 1
        if event.at is not None and (entry[1] is None or event.at > entry[1]):
            entry[1] = event.at
    per_gpu: dict[int, list[XidCount]] = {}
    for (index, xid), (count, last) in sorted(counts.items()):
        per_gpu.setdefault(index, []).append(
            XidCount(xid, count, last.isoformat() if last else None, xid_code(xid).description)
        )
    return {index: tuple(found) for index, found in per_gpu.items()}, unmatched


@dataclass(frozen=True)
class KernelLog:
    """What reading the kernel log gave: events, or why it could not be read."""

    events: tuple[XidEvent, ...] = ()
    error: str = ""
    denied: bool = False


def read_kernel_log(runner: Runner, now: datetime) -> KernelLog:
    result: CommandResult = runner.run(list(KERNEL_LOG_ARGV), timeout=COMMAND_TIMEOUT_S)
    if result.ok:
        return KernelLog(events=tuple(parse_kernel_log(result.stdout, now)))
    said = (result.error or result.stderr or result.stdout).strip()
    denied = "not permitted" in said.lower() or "permission denied" in said.lower()
    return KernelLog(error=said[:300] or f"dmesg exited with code {result.exit_code}", denied=denied)


def newer_xids(current: Sequence[dict], acknowledged: Sequence[dict]) -> bool:
    """Whether `current` (a GPU's xid_errors) holds an Xid that `acknowledged` did not:
    a code not seen then, a later last_seen, or, without times, a higher count."""
    seen = {entry["xid"]: entry for entry in acknowledged}
    for entry in current:
        before = seen.get(entry["xid"])
        if before is None:
            return True
        if entry.get("last_seen") and before.get("last_seen"):
            if entry["last_seen"] > before["last_seen"]:
                return True
        elif entry["count"] > before["count"]:
            return True
    return False
