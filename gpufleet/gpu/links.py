"""A GPU's links: its PCIe link against the one it should have, and its NVLinks (down
where they should be up, error counters that grow). Pure: the doctor calls it with the
GPUs it detected and what this agent process saw of their NVLinks before."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gpufleet.gpu.devices import NVLINK_COUNTERS, Device, LinkMemory
from gpufleet.gpu.findings import Finding, Status

PCIE_REMEDY = (
    "Reseat the GPU; check its riser, slot and their cables (a damaged riser often trains at a lower width);"
    " in the BIOS set the slot's PCIe speed to Auto or its maximum generation. Compare LnkSta with LnkCap in"
    " sudo lspci -vv -s {bus}."
)
NVLINK_DOWN_REMEDY = (
    "Check the NVLink bridge or the baseboard's NVSwitch (nvidia-smi topo -m, and on NVSwitch systems systemctl"
    " status nvidia-fabricmanager); reset the GPU when it is idle (nvidia-smi -r -i {index}), else drain the node"
    " and have the board inspected."
)
NVLINK_ERRORS_REMEDY = (
    "Growing replay, recovery or CRC errors are a marginal link: drain the node when convenient, reseat the bridge"
    " or have the baseboard inspected; nvidia-smi nvlink -e -i {index} shows the counters."
)
_COUNTER_NAMES = {"replay_errors": "replay", "recovery_errors": "recovery", "crc_errors": "CRC"}


def label(device: Device) -> str:
    """"GPU 3 (NVIDIA H200, PCI 00000000:9B:00.0)": index and address, as admins find it."""
    where = f", PCI {device.pci_bus_id}" if device.pci_bus_id else ""
    return f"GPU {device.index} ({device.name}{where})"


def downtrained(device: Device) -> bool:
    """Whether the PCIe link runs below its maximum generation or width (both known)."""
    gen, gen_max = device.pcie_link_gen, device.pcie_link_gen_max
    width, width_max = device.pcie_link_width, device.pcie_link_width_max
    return (gen is not None and gen_max is not None and gen < gen_max) or (
        width is not None and width_max is not None and width < width_max)


def pcie_finding(device: Device, busy: Callable[[Device], bool]) -> Finding | None:
    """A busy GPU whose PCIe link trained below what it should have warns. An idle GPU
    lowers its link generation on purpose to save power: that says nothing."""
    if not downtrained(device) or not busy(device):
        return None
    has = f"Gen{_known(device.pcie_link_gen)} x{_known(device.pcie_link_width)}"
    should = f"Gen{_known(device.pcie_link_gen_max)} x{_known(device.pcie_link_width_max)}"
    return Finding(
        f"gpu{device.index}.pcie",
        label(device),
        Status.WARN,
        f"PCIe link downtrained while busy: it runs at {has}, it should run at {should}"
        " (host-to-GPU transfers are slower by as much)",
        PCIE_REMEDY.format(bus=device.pci_bus_id or "<PCI address>"),
    )


def nvlink_finding(device: Device, devices: Sequence[Device], memory: LinkMemory | None,
                   now: datetime) -> Finding | None:
    """A link down that should be up fails: one this process saw up before, or one whose
    number is up on another GPU of the node (the boards wire every GPU alike). Error
    counters that grew since the previous collection warn, with their rate."""
    if not device.nvlink:
        return None
    memory = memory or LinkMemory()
    expected = set(memory.ever_up.get(device.uuid, ()))
    for other in devices:
        if other.uuid != device.uuid:
            expected.update(link.link for link in other.nvlink if link.state == "up")
    down = [link.link for link in device.nvlink if link.state == "down" and link.link in expected]
    grown = _grown(device, memory, now)
    if not down and not grown:
        return None
    said, status, fix = [], Status.WARN, NVLINK_ERRORS_REMEDY
    if down:
        up = sum(link.state == "up" for link in device.nvlink)
        said.append(f"NVLink {', '.join(map(str, down))} down ({up} of {len(device.nvlink)} links up)")
        status, fix = Status.FAIL, NVLINK_DOWN_REMEDY
    if grown:
        said.append("NVLink errors growing: " + "; ".join(grown))
    return Finding(f"gpu{device.index}.nvlink", label(device), status, "; ".join(said), fix.format(index=device.index))


def _grown(device: Device, memory: LinkMemory, now: datetime) -> list[str]:
    before = memory.seen.get(device.uuid)
    if before is None:
        return []
    then, links = before
    minutes = max((now - then).total_seconds() / 60, 1 / 60)
    grown = []
    for link in device.nvlink:
        old = links.get(link.link)
        if old is None:
            continue
        parts = []
        for name in NVLINK_COUNTERS:
            new_count, old_count = getattr(link, name), getattr(old, name)
            # A smaller count is a reset (driver reload, nvidia-smi nvlink -r): no growth.
            if new_count is not None and old_count is not None and new_count > old_count:
                parts.append(f"{_COUNTER_NAMES[name]} +{new_count - old_count} ({(new_count - old_count) / minutes:.1f}/min)")
        if parts:
            grown.append(f"link {link.link} " + ", ".join(parts))
    return grown


def _known(value: int | None) -> str:
    return "?" if value is None else str(value)
