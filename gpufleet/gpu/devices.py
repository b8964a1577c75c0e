"""GPU detection: parse what nvidia-smi prints and combine it with Docker's facts.

Most nodes have no GPU, so a missing or failing nvidia-smi is an answer ("no GPU",
with the reason kept for the dashboard), never an exception.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields, replace
from dataclasses import field as default_of
from datetime import datetime

from gpufleet.gpu.interfaces import COMMAND_TIMEOUT_S, CommandResult, DockerInfo, Runner
from gpufleet.gpu.processes import Container, GpuProcess
from gpufleet.gpu.remedies import INSTALL_COMMAND


@dataclass(frozen=True)
class SmiField:
    """One `--query-gpu` field: nvidia-smi's name, our key, and how to read its value."""

    query: str
    key: str
    kind: str  # "int", "float", "text", "bool"
    unit: str = ""  # what nvidia-smi appends without "nounits"; hosts differ, so both are read


# The reference package's seven fields: detection never goes without them.
REFERENCE_FIELDS: tuple[SmiField, ...] = (
    SmiField("index", "index", "int"),
    SmiField("uuid", "uuid", "text"),
    SmiField("name", "name", "text"),
    SmiField("memory.total", "vram_total_mib", "int", "MiB"),
    SmiField("memory.used", "vram_used_mib", "int", "MiB"),
    SmiField("utilization.gpu", "utilization_percent", "int", "%"),
    SmiField("driver_version", "driver_version", "text"),
)
# What fleet admins judge health by. A driver may not know some of them; those
# are dropped from the query (see SmiQuery), never the reference fields.
HEALTH_FIELDS: tuple[SmiField, ...] = (
    SmiField("pci.bus_id", "pci_bus_id", "text"),
    SmiField("temperature.gpu", "temperature_c", "int"),
    SmiField("temperature.memory", "memory_temperature_c", "int"),
    SmiField("power.draw", "power_draw_w", "float", "W"),
    SmiField("enforced.power.limit", "power_limit_w", "float", "W"),
    SmiField("fan.speed", "fan_percent", "int", "%"),
    SmiField("pstate", "pstate", "text"),
    SmiField("clocks.current.sm", "sm_clock_mhz", "int", "MHz"),
    SmiField("clocks.max.sm", "sm_clock_max_mhz", "int", "MHz"),
    SmiField("persistence_mode", "persistence_mode", "bool"),
    SmiField("ecc.mode.current", "ecc_mode", "bool"),
    SmiField("ecc.errors.corrected.volatile.total", "ecc_corrected_volatile", "int"),
    SmiField("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_volatile", "int"),
    SmiField("ecc.errors.uncorrected.aggregate.total", "ecc_uncorrected_aggregate", "int"),
    SmiField("retired_pages.pending", "retired_pages_pending", "bool"),
    SmiField("remapped_rows.correctable", "remapped_rows_correctable", "int"),
    SmiField("remapped_rows.uncorrectable", "remapped_rows_uncorrectable", "int"),
    SmiField("remapped_rows.pending", "remapped_rows_pending", "bool"),
    SmiField("remapped_rows.failure", "remapped_rows_failure", "bool"),
    SmiField("clocks_event_reasons.hw_slowdown", "hw_slowdown", "bool"),
    SmiField("clocks_event_reasons.hw_thermal_slowdown", "hw_thermal_slowdown", "bool"),
    SmiField("clocks_event_reasons.sw_thermal_slowdown", "sw_thermal_slowdown", "bool"),
    SmiField("clocks_event_reasons.hw_power_brake_slowdown", "hw_power_brake_slowdown", "bool"),
    SmiField("clocks_event_reasons.sw_power_cap", "sw_power_cap", "bool"),
    SmiField("mig.mode.current", "mig_mode", "bool"),
    # The PCIe link as it is and as it could be: below its maximum while busy, it was
    # downtrained (an idle GPU lowers its generation on purpose).
    SmiField("pcie.link.gen.current", "pcie_link_gen", "int"),
    SmiField("pcie.link.gen.max", "pcie_link_gen_max", "int"),
    SmiField("pcie.link.width.current", "pcie_link_width", "int"),
    SmiField("pcie.link.width.max", "pcie_link_width_max", "int"),
    SmiField("power.draw.average", "power_draw_average_w", "float", "W"),
    # How long each reason held the clocks down since the driver loaded (R535 and later).
    SmiField("clocks_event_reasons_counters.sw_power_cap", "sw_power_cap_us", "int", "us"),
    SmiField("clocks_event_reasons_counters.sw_thermal_slowdown", "sw_thermal_slowdown_us", "int", "us"),
    SmiField("clocks_event_reasons_counters.hw_thermal_slowdown", "hw_thermal_slowdown_us", "int", "us"),
    SmiField("clocks_event_reasons_counters.hw_power_brake_slowdown", "hw_power_brake_slowdown_us", "int", "us"),
    SmiField("clocks_event_reasons_counters.sync_boost", "sync_boost_us", "int", "us"),
)
ALL_FIELDS = REFERENCE_FIELDS + HEALTH_FIELDS
# Drivers before R535 know the clock-event reasons by their old name only.
_OLD_NAMES = {"clocks_event_reasons.": "clocks_throttle_reasons."}
THROTTLE_REASONS = tuple(f.key for f in HEALTH_FIELDS if f.query.startswith("clocks_event_reasons."))
SMI_LIST_ARGV = ["nvidia-smi", "-L"]
# The fields this driver knows, with what each means: asked once per agent process.
SMI_HELP_ARGV = ["nvidia-smi", "--help-query-gpu"]
NVLINK_STATUS_ARGV = ["nvidia-smi", "nvlink", "-s"]
NVLINK_ERRORS_ARGV = ["nvidia-smi", "nvlink", "-e"]


def smi_query_argv(fields: Sequence[SmiField]) -> list[str]:
    return ["nvidia-smi", "--query-gpu=" + ",".join(f.query for f in fields), "--format=csv,noheader,nounits"]


SMI_QUERY_ARGV: list[str] = smi_query_argv(ALL_FIELDS)
REFERENCE_QUERY_ARGV: list[str] = smi_query_argv(REFERENCE_FIELDS)
# An older driver names the first field it does not know and exits non-zero.
_REJECTED_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query', re.ASCII)
# A property line of `--help-query-gpu`: its name and aliases, quoted, joined by " or "
# ("pcie.link.gen.current" or "pcie.link.gen.gpucurrent"). Description lines may start
# with a quoted word too ("0: Default" means ...), but never consist of names alone.
_HELP_NAMES = re.compile(r'"[^"\s]+"(?: or "[^"\s]+")*', re.ASCII)
_HELP_NAME = re.compile(r'"([^"]+)"', re.ASCII)


def parse_help_query_gpu(text: str) -> frozenset[str]:
    """Every field name (aliases included) that `nvidia-smi --help-query-gpu` lists."""
    names: set[str] = set()
    for line in text.splitlines():
        if _HELP_NAMES.fullmatch(line.strip()):
            names.update(_HELP_NAME.findall(line))
    return frozenset(names)


class SmiQuery:
    """The `--query-gpu` fields this host's driver knows, learnt once per agent process
    (keep one per process) and again when the driver changes.

    First from `nvidia-smi --help-query-gpu`: only the fields it lists are asked for, in
    one call. Where that fails, every field is asked and a field the driver rejects is
    dropped with the fields of its group (an old driver that lacks `remapped_rows.pending`
    lacks them all), then asked again by its old name where it had one
    (`clocks_throttle_reasons.*`), as many times as it takes: each retry asks for fewer
    fields, and every field the driver knows is kept. Whether the GPUs have NVLink is
    remembered too, so a host without it is asked once."""

    def __init__(self) -> None:
        self.rejected: set[str] = set()
        self.reference_only = False
        # What --help-query-gpu listed; None until asked, or when it could not be read.
        self.known: frozenset[str] | None = None
        self.asked_help = False
        # Whether nvidia-smi ran for it (not missing, not hung): else it is asked again
        # once nvidia-smi answers a query.
        self.help_ran = False
        # The driver the fields were learnt from: another one is asked again.
        self.driver = ""
        self.nvlink: bool | None = None
        # What the GPUs' NVLinks were at the previous collection (gpu/links.py).
        self.links = LinkMemory()

    def forget(self) -> None:
        """Start again, for a new driver."""
        self.__init__()

    @property
    def fields(self) -> tuple[SmiField, ...]:
        if self.reference_only:
            return REFERENCE_FIELDS
        asked = []
        for field in HEALTH_FIELDS:
            if self._may_ask(field.query):
                asked.append(field)
            elif (old := _old_name(field)) is not None and self._may_ask(old.query):
                asked.append(old)
        return REFERENCE_FIELDS + tuple(asked)

    def _may_ask(self, query: str) -> bool:
        return query not in self.rejected and (self.known is None or query in self.known)

    def argv(self) -> list[str]:
        return smi_query_argv(self.fields)

    def learn(self, help_text: str) -> None:
        """Take the fields `--help-query-gpu` printed; a listing without the reference
        fields is not one (an error text, a wrapper's own help), so it is ignored."""
        known = parse_help_query_gpu(help_text)
        if all(f.query in known for f in REFERENCE_FIELDS):
            self.known = known

    def reject(self, query: str) -> bool:
        """Drop `query` (and, where the driver's list is unknown, its group); False when it
        is not an optional field we asked for."""
        optional = self.fields[len(REFERENCE_FIELDS):]
        if self.known is not None:
            dropped = {f.query for f in optional if f.query == query}
        else:
            group = _field_group(query)
            dropped = {f.query for f in optional if _field_group(f.query) == group}
        if query not in dropped:
            return False
        self.rejected |= dropped
        return True


# Fields that drivers added (or renamed) together: one rejected means all are unknown.
_FIELD_GROUPS = ("clocks_event_reasons.", "clocks_throttle_reasons.", "clocks_event_reasons_counters.",
                 "remapped_rows.", "ecc.errors.", "pcie.link.")


def _field_group(query: str) -> str:
    return next((prefix for prefix in _FIELD_GROUPS if query.startswith(prefix)), query)


def _old_name(field: SmiField) -> SmiField | None:
    for new, old in _OLD_NAMES.items():
        if field.query.startswith(new):
            return replace(field, query=old + field.query[len(new):])
    return None


INSTALL_HINT = (
    "NVIDIA GPUs are present but Docker cannot attach them: it has neither the nvidia runtime"
    " nor NVIDIA CDI devices. Install the NVIDIA Container Toolkit and register it with Docker: "
    + INSTALL_COMMAND
)

# The CDI kind NVIDIA's toolkit writes for whole GPUs and MIG devices; other
# nvidia.com kinds (gds, mofed, imex channels) do not give a container a GPU.
NVIDIA_GPU_CDI_PREFIX = "nvidia.com/gpu="

# Longest reason text kept from a failing command, so one chatty host cannot
# bloat every snapshot.
_MAX_REASON_CHARS = 500

# nvidia-smi prints "[N/A]", "[Not Supported]", "[Unknown Error]" ... where it has no number.
_PLACEHOLDER = re.compile(r"\[[^\]]*\]|N/A", re.ASCII)
# "WARNING: infoROM is corrupted at gpu 0000:4B:00.0" and the like: a word and a
# colon can never start a data row, whose first field is an index.
_NOTICE = re.compile(r"[A-Za-z][A-Za-z ]*:")


@dataclass(frozen=True)
class MigDevice:
    """One MIG slice of a GPU, as `nvidia-smi -L` lists it."""

    uuid: str
    profile: str  # such as "3g.40gb"
    device: int

    def to_dict(self) -> dict:
        return {"uuid": self.uuid, "profile": self.profile, "device": self.device}


@dataclass(frozen=True)
class XidCount:
    """How often one Xid code hit one GPU within the window, and when last."""

    xid: int
    count: int
    last_seen: str | None  # ISO 8601, None when the log line carried no usable time
    description: str

    def to_dict(self) -> dict:
        return {"xid": self.xid, "count": self.count, "last_seen": self.last_seen, "description": self.description}


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU: up or down, as `nvidia-smi nvlink -s` shows it, and its error
    counters since the driver loaded, as `nvidia-smi nvlink -e` shows them (None where
    the driver printed none)."""

    link: int
    state: str  # "up" or "down"
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None

    def to_dict(self) -> dict:
        return {"link": self.link, "state": self.state, "replay_errors": self.replay_errors,
                "recovery_errors": self.recovery_errors, "crc_errors": self.crc_errors}


NVLINK_COUNTERS = ("replay_errors", "recovery_errors", "crc_errors")


@dataclass
class LinkMemory:
    """What this agent process saw of each GPU's NVLinks (by UUID): when, their error
    counters, and which links were ever up. Kept per process, like the fields the driver
    knows; a restarted agent compares from its second collection on."""

    seen: dict[str, tuple[datetime, dict[int, NvLink]]] = default_of(default_factory=dict)
    ever_up: dict[str, set[int]] = default_of(default_factory=dict)

    def remember(self, devices: Sequence[Device], now: datetime) -> None:
        for device in devices:
            if device.nvlink:
                self.seen[device.uuid] = (now, {link.link: link for link in device.nvlink})
                self.ever_up.setdefault(device.uuid, set()).update(
                    link.link for link in device.nvlink if link.state == "up")


@dataclass(frozen=True)
class Device:
    """One GPU as reported by nvidia-smi. None means nvidia-smi gave no value: it
    printed a placeholder ("[N/A]", "[Not Supported]"), or this driver does not know
    the field (unified-memory parts such as GH200 report no memory, many report no
    utilization)."""

    index: int
    uuid: str
    name: str
    vram_total_mib: int | None
    vram_used_mib: int | None
    utilization_percent: int | None
    pci_bus_id: str | None = None
    temperature_c: int | None = None
    memory_temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    fan_percent: int | None = None
    pstate: str | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    persistence_mode: bool | None = None
    ecc_mode: bool | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # The active clock-event (throttle) reasons, by short name; None when not reported.
    throttle_reasons: tuple[str, ...] | None = None
    mig_mode: bool | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    power_draw_average_w: float | None = None
    # Microseconds the clocks were held down for each reason since the driver loaded.
    sw_power_cap_us: int | None = None
    sw_thermal_slowdown_us: int | None = None
    hw_thermal_slowdown_us: int | None = None
    hw_power_brake_slowdown_us: int | None = None
    sync_boost_us: int | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    xid_errors: tuple[XidCount, ...] = ()
    # The compute processes on it, each with its container (gpu.processes.GpuProcess).
    processes: tuple[GpuProcess, ...] = ()
    # Containers that asked for this GPU and run no process on it yet ("attached, idle").
    attached_idle: tuple[Container, ...] = ()
    # Its NVLinks, none on a GPU without them.
    nvlink: tuple[NvLink, ...] = ()

    def to_dict(self) -> dict:
        data = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NESTED_DEVICE_FIELDS:
                value = [item.to_dict() for item in value]
            elif isinstance(value, tuple):
                value = list(value)
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Device:
        """The inverse of to_dict. A key an agent did not send stays unknown; a key that
        is no field of a Device is refused (ValueError), never dropped."""
        _check_device_keys(data)
        values = dict(data)
        for name, record in _DEVICE_RECORDS.items():
            if name in values:
                values[name] = tuple(record(values["uuid"], item) for item in values[name])
        if values.get("throttle_reasons") is not None:
            values["throttle_reasons"] = tuple(values["throttle_reasons"])
        return cls(**values)

    @property
    def pci_address(self) -> tuple[int, int, int] | None:
        return pci_address(self.pci_bus_id or "")


# What a GPU is, field by field: the one list the wire schema (gpufleet/ingest/schema.py),
# the stored rows (fleet Device: its columns, the rest in `health`) and the exports follow;
# tests/fleet/test_device_schema.py fails where one of them does not.
DEVICE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Device))
_DEVICE_FIELDS = frozenset(DEVICE_FIELDS)
_REQUIRED_DEVICE_FIELDS = frozenset(f.name for f in fields(Device) if f.default is MISSING)
# The fields a GPU holds when an agent did not send them (an older one did not know them).
_DEVICE_DEFAULTS = tuple((f.name, None if f.default is MISSING else f.default) for f in fields(Device))


def _check_device_keys(data: dict) -> None:
    # Compared as they stand; the differences are made only to name them.
    if not data.keys() <= _DEVICE_FIELDS:
        raise ValueError(f"not fields of a GPU: {', '.join(sorted(map(str, data.keys() - _DEVICE_FIELDS)))}")
    if not data.keys() >= _REQUIRED_DEVICE_FIELDS:
        raise TypeError(f"a Device needs {', '.join(sorted(_REQUIRED_DEVICE_FIELDS - data.keys()))}")


def _process_from_dict(gpu_uuid: str, data: dict) -> GpuProcess:
    container = Container(**data["container"]) if data.get("container") else None  # "claim" is optional
    return GpuProcess(gpu_uuid, data["pid"], data["name"], data.get("used_mib"), container)


# The Device's fields that hold lists of records of their own (dicts in to_dict's form),
# each with how a record is read from its dict, given the GPU's UUID.
_DEVICE_RECORDS = {
    "mig_devices": lambda gpu_uuid, data: MigDevice(**data),
    "xid_errors": lambda gpu_uuid, data: XidCount(**data),
    "processes": _process_from_dict,
    "attached_idle": lambda gpu_uuid, data: Container(**data),
    "nvlink": lambda gpu_uuid, data: NvLink(**data),
}
NESTED_DEVICE_FIELDS = tuple(_DEVICE_RECORDS)


def device_dict(data: dict) -> dict:
    """`Device.from_dict(data).to_dict()` without making the Device: a GPU as sent or
    stored, what an older agent did not send filled in, in to_dict's form and key order,
    refused as from_dict refuses it. For readers of a fleet's GPUs (the exports), where
    a Device each was most of their cost; the few records in its lists are still read
    as records."""
    _check_device_keys(data)
    get = data.get
    values = {name: get(name, default) for name, default in _DEVICE_DEFAULTS}
    uuid = values["uuid"]
    for name, record in _DEVICE_RECORDS.items():
        values[name] = [record(uuid, item).to_dict() for item in values[name]]
    if values["throttle_reasons"] is not None:
        values["throttle_reasons"] = list(values["throttle_reasons"])
    return values


def uuid_key(uuid: str) -> str:
    """A GPU or MIG UUID as claims name it: trimmed, in any case. Two devices of a node
    with the same key would let a claim pinned by one hold the other."""
    return uuid.strip().lower()


# "00000000:9B:00.0" (nvidia-smi), "0000:9b:00" (Xid lines), "0000:b3:00.0" (kernel):
# domain, bus and device compare; the function number does not.
_PCI = re.compile(r"(?:PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", re.ASCII)


def pci_address(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address in any of the forms above, or None."""
    match = _PCI.fullmatch(text.strip())
    if not match:
        return None
    return tuple(int(part, 16) for part in match.groups())  # type: ignore[return-value]


class SmiParseError(ValueError):
    """nvidia-smi printed a row that cannot be read. Names the row and its text."""

    def __init__(self, row: int, text: str, problem: str):
        super().__init__(f"row {row}: {problem}: {text!r}")
        self.row = row
        self.text = text
        self.problem = problem


def parse_smi(text: str, query: Sequence[SmiField] = REFERENCE_FIELDS) -> tuple[str, list[Device]]:
    """Parse the CSV that nvidia-smi prints for the `query` fields into (driver version, devices).

    Blank lines, notices ("WARNING: ...", "Unable to determine the device handle ...")
    and lines without a comma are skipped, as is a header row; every other line must
    be a readable row of len(query) fields, else SmiParseError. Values with units
    ("143771 MiB", "100 %") are accepted because hosts differ.
    """
    driver = ""
    devices: list[Device] = []
    seen_index: dict[int, int] = {}
    seen_uuid: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or "," not in stripped or _NOTICE.match(stripped):
            continue
        try:
            values = [v.strip() for v in next(csv.reader([stripped], skipinitialspace=True))]
        except (csv.Error, StopIteration) as exc:
            raise SmiParseError(number, line, f"not CSV ({exc})") from None
        if values and values[0].lower() == "index":
            continue  # a header row, printed when someone drops "noheader"
        if len(values) != len(query):
            raise SmiParseError(number, line, f"expected {len(query)} fields, got {len(values)}")
        row = {f.key: _value(f, v, number, line) for f, v in zip(query, values, strict=True)}
        if row["index"] is None:
            raise SmiParseError(number, line, f"index {values[0]!r} is not a number")
        if not row["uuid"]:
            raise SmiParseError(number, line, "empty UUID")
        device = _device(row)
        # Duplicates would make the ledger resolve one id to two GPUs.
        if device.index in seen_index:
            raise SmiParseError(number, line, f"index {device.index} also on row {seen_index[device.index]}")
        if device.uuid.lower() in seen_uuid:
            raise SmiParseError(number, line, f"UUID also on row {seen_uuid[device.uuid.lower()]}")
        row_driver = row["driver_version"] or ""
        if devices and row_driver != driver:
            raise SmiParseError(number, line, f"driver {row_driver!r} differs from {driver!r}")
        seen_index[device.index] = number
        seen_uuid[device.uuid.lower()] = number
        driver = row_driver
        devices.append(device)
    return driver, devices


def _device(row: dict) -> Device:
    throttle = None
    if any(key in row for key in THROTTLE_REASONS):
        known = [key for key in THROTTLE_REASONS if row.get(key) is not None]
        throttle = tuple(key for key in known if row[key]) if known else None
    values = {k: v for k, v in row.items() if k not in THROTTLE_REASONS and k != "driver_version"}
    return Device(**values, throttle_reasons=throttle)


_NUMBER = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(\S*)", re.ASCII)
_TRUE = {"enabled", "yes", "active", "on"}
_FALSE = {"disabled", "no", "not active", "off"}


def _value(f: SmiField, value: str, row: int, line: str):
    """One field's value: None for nvidia-smi's placeholders, else by the field's kind.
    A health field this code cannot read (a word or unit some driver prints that we
    have not seen) is unknown too: an extra field must never cost detection. Only the
    reference fields must read, or the row is not one."""
    if _PLACEHOLDER.fullmatch(value):
        return None
    if f not in REFERENCE_FIELDS:
        try:
            return _read(f, value, row, line)
        except SmiParseError:
            return None
    return _read(f, value, row, line)


def _read(f: SmiField, value: str, row: int, line: str):
    if f.kind == "text":
        return value
    if f.kind == "bool":
        word = value.lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise SmiParseError(row, line, f"{f.query} {value!r} is not one of Enabled/Disabled, Yes/No, Active/Not Active")
    match = _NUMBER.fullmatch(value)
    if not match or match.group(2) not in ("", f.unit) or (f.kind == "int" and "." in match.group(1)):
        raise SmiParseError(row, line, f"{f.query} {value!r} is not a number")
    return int(match.group(1)) if f.kind == "int" else float(match.group(1))


@dataclass(frozen=True)
class Info:
    """A node's GPU capability snapshot. `no_gpu_reason` says why `present` is False."""

    present: bool
    driver_version: str
    devices: tuple[Device, ...]
    runtime_installed: bool
    cdi_devices: tuple[str, ...] = ()
    no_gpu_reason: str = ""
    # GPUs nvidia-smi could not reach while it listed the others ("GPU is lost").
    lost_gpus: tuple[LostGpu, ...] = ()
    # Why nvidia-smi exited non-zero although its rows were readable (a corrupt infoROM).
    smi_notice: str = ""

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def usable(self) -> bool:
        """Whether a container can be given a GPU here. Unlike the reference package,
        Docker's NVIDIA CDI devices count as well as the legacy nvidia runtime."""
        return self.present and (self.runtime_installed or bool(self.cdi_devices))

    @property
    def hint(self) -> str:
        """Remedy when GPUs exist but cannot be attached; empty when there is nothing
        to fix, including on a node with no GPU."""
        if self.present and not self.usable:
            return INSTALL_HINT
        return ""


def detect(runner: Runner, docker_info: DockerInfo, query: SmiQuery | None = None) -> Info:
    """Return the node's GPU snapshot from nvidia-smi (run through `runner`, which is
    expected to set LC_ALL=C) and Docker's /info facts. Never raises for a host that
    has no GPU or a broken one: the reason ends up in `no_gpu_reason`. `query` keeps
    the fields this driver knows from one detection to the next."""
    return _detect(runner, docker_info, query or SmiQuery(), relearn=True)


def _detect(runner: Runner, docker_info: DockerInfo, query: SmiQuery, relearn: bool) -> Info:
    runtime_installed = any(name.lower() == "nvidia" for name in docker_info.runtimes)
    cdi_devices = tuple(d for d in docker_info.cdi_devices if is_nvidia_gpu_cdi_device(d))

    def absent(reason: str) -> Info:
        return Info(
            present=False,
            driver_version="",
            devices=(),
            runtime_installed=runtime_installed,
            cdi_devices=cdi_devices,
            no_gpu_reason=reason,
        )

    result = _run_query(runner, query)
    if result.error:
        return absent(command_failure(result))
    stdout = result.stdout
    if result.truncated:
        stdout = stdout.rsplit("\n", 1)[0]  # the cut may fall inside a row
    try:
        driver, devices = parse_smi(stdout, query.fields)
    except SmiParseError as exc:
        if result.exit_code != 0:
            return absent(command_failure(result))
        return absent(f"nvidia-smi output could not be read: {exc}")
    if relearn and ((query.driver and driver and driver != query.driver) or not query.help_ran):
        # Another driver since the fields were learnt, or nvidia-smi could not say which
        # it knows before (missing then): learn them again, then ask.
        query.forget()
        return _detect(runner, docker_info, query, relearn=False)
    query.driver = driver or query.driver
    lost = lost_gpus(result.stdout + "\n" + result.stderr)
    if not devices:
        if result.exit_code != 0:
            return absent(command_failure(result))
        said = _output_text(result)
        return absent(f"nvidia-smi listed no GPUs: {said}" if said else "nvidia-smi listed no GPUs")
    if any(d.mig_mode for d in devices):
        devices = _with_mig_devices(runner, devices)
    devices = _with_nvlinks(runner, devices, query)
    return Info(
        present=True,
        driver_version=driver,
        devices=tuple(devices),
        runtime_installed=runtime_installed,
        cdi_devices=cdi_devices,
        lost_gpus=lost,
        # Readable rows despite a non-zero exit: keep the GPUs, say why it complained.
        smi_notice=_notice(result),
    )


def _run_query(runner: Runner, query: SmiQuery) -> CommandResult:
    """Run the GPU query for the fields this driver knows: those --help-query-gpu lists
    (asked once), else every field, dropping those the driver rejects. Each retry asks
    for fewer fields, so the loop ends; only a driver that rejects the query for no field
    it names is asked for the reference fields alone."""
    if not query.asked_help:
        helped = runner.run(list(SMI_HELP_ARGV), timeout=COMMAND_TIMEOUT_S)
        query.asked_help, query.help_ran = True, not helped.error
        if helped.ok:
            query.learn(helped.stdout)
    for _ in range(len(HEALTH_FIELDS) + 1):
        result = runner.run(query.argv(), timeout=COMMAND_TIMEOUT_S)
        if result.error or result.exit_code == 0 or query.reference_only:
            return result
        rejected = _REJECTED_FIELD.search(result.stdout + "\n" + result.stderr)
        if rejected and query.reject(rejected.group(1)):
            continue
        if result.exit_code != _SMI_BAD_ARGUMENT:
            return result  # a failure of the driver, not of our query
        break
    query.reference_only = True
    return runner.run(query.argv(), timeout=COMMAND_TIMEOUT_S)


def _notice(result: CommandResult) -> str:
    said = []
    if result.exit_code != 0:
        said.append(command_failure(result))
    if result.truncated:
        said.append("nvidia-smi printed more than 1 MiB; the rest was ignored")
    return "; ".join(said)


# nvidia-smi's exit code for "a supplied argument or flag is invalid".
_SMI_BAD_ARGUMENT = 2


@dataclass(frozen=True)
class LostGpu:
    """A GPU nvidia-smi could not reach: its PCI address and what nvidia-smi said."""

    pci_bus_id: str
    reason: str


_LOST = re.compile(r"Unable to determine the device handle for (?:GPU )?([0-9A-Fa-f:.]+):\s*(.*)", re.ASCII)


def lost_gpus(text: str) -> tuple[LostGpu, ...]:
    """The GPUs that nvidia-smi names as unreachable, each once."""
    lost: dict[str, LostGpu] = {}
    for line in text.splitlines():
        match = _LOST.search(line)
        if match:
            pci = match.group(1).rstrip(".:")
            lost.setdefault(pci.lower(), LostGpu(pci, _clip(match.group(2).strip() or "GPU is lost")))
    return tuple(lost.values())


# "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-…)" then its slices,
# "  MIG 3g.40gb     Device  0: (UUID: MIG-…)".
_LIST_GPU = re.compile(r"GPU\s+([0-9]+):.*\(UUID:\s*(GPU-[^)\s]+)\)", re.ASCII)
_LIST_MIG = re.compile(r"MIG\s+(\S+)\s+Device\s+([0-9]+):\s*\(UUID:\s*(MIG-[^)\s]+)\)", re.ASCII)


def parse_mig_list(text: str) -> dict[int, tuple[MigDevice, ...]]:
    """MIG slices per GPU index from `nvidia-smi -L`; lines it does not know are skipped."""
    slices: dict[int, list[MigDevice]] = {}
    current: int | None = None
    for line in text.splitlines():
        if gpu_line := _LIST_GPU.search(line):
            current = int(gpu_line.group(1))
            slices.setdefault(current, [])
        elif (mig_line := _LIST_MIG.search(line)) and current is not None:
            profile, number, uuid = mig_line.groups()
            slices[current].append(MigDevice(uuid=uuid, profile=profile, device=int(number)))
    return {index: tuple(found) for index, found in slices.items()}


def _with_mig_devices(runner: Runner, devices: list[Device]) -> list[Device]:
    """Add each MIG-enabled GPU's slices; without a listing the GPUs stay as they are."""
    result = runner.run(list(SMI_LIST_ARGV), timeout=COMMAND_TIMEOUT_S)
    if not result.ok:
        return devices
    slices = parse_mig_list(result.stdout)
    return [replace(d, mig_devices=slices.get(d.index, ())) if d.mig_mode else d for d in devices]


# "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-…)", then its links, "\t Link 0: 25 GB/s" or
# "\t Link 4: <inactive>" (nvlink -s), "\t Link 0: Replay Errors: 0" (nvlink -e).
_NVLINK_GPU = re.compile(r"GPU\s+([0-9]+):", re.ASCII)
_NVLINK_STATE = re.compile(r"\s*Link\s+([0-9]+):\s*(.*?)\s*", re.ASCII)
_NVLINK_COUNT = re.compile(r"\s*Link\s+([0-9]+):\s*([A-Za-z ]+?)\s*:\s*([0-9]+)\s*", re.ASCII)
_LINK_SPEED = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*GB/s", re.ASCII)
# nvlink -e's counter names; older drivers split CRC errors into flit and data errors.
_NVLINK_COUNTER_NAMES = {"replay errors": "replay_errors", "recovery errors": "recovery_errors",
                         "crc errors": "crc_errors"}
_NVLINK_CRC_PARTS = ("crc flit errors", "crc data errors")


def parse_nvlink_status(text: str) -> dict[int, dict[int, str]]:
    """Each GPU's links from `nvidia-smi nvlink -s`, by GPU index then link: "up" for a
    link with a speed, "down" for one shown inactive. A GPU without links has none."""
    links: dict[int, dict[int, str]] = {}
    current: int | None = None
    for line in text.splitlines():
        if gpu_line := _NVLINK_GPU.match(line.strip()):
            current = int(gpu_line.group(1))
            links.setdefault(current, {})
        elif (link := _NVLINK_STATE.fullmatch(line)) and current is not None:
            speed = _LINK_SPEED.search(link.group(2))
            links[current][int(link.group(1))] = "up" if speed and float(speed.group(1)) > 0 else "down"
    return links


def parse_nvlink_errors(text: str) -> dict[int, dict[int, dict[str, int]]]:
    """Each link's error counters from `nvidia-smi nvlink -e`, by GPU index then link."""
    counts: dict[int, dict[int, dict[str, int]]] = {}
    current: int | None = None
    for line in text.splitlines():
        if gpu_line := _NVLINK_GPU.match(line.strip()):
            current = int(gpu_line.group(1))
            counts.setdefault(current, {})
        elif (count := _NVLINK_COUNT.fullmatch(line)) and current is not None:
            link, name, value = int(count.group(1)), count.group(2).lower(), int(count.group(3))
            found = counts[current].setdefault(link, {})
            if name in _NVLINK_COUNTER_NAMES:
                found[_NVLINK_COUNTER_NAMES[name]] = value
            elif name in _NVLINK_CRC_PARTS:
                found["crc_parts"] = found.get("crc_parts", 0) + value
    for per_gpu in counts.values():
        for found in per_gpu.values():
            parts = found.pop("crc_parts", None)
            if parts is not None:
                found.setdefault("crc_errors", parts)
    return counts


def _with_nvlinks(runner: Runner, devices: list[Device], query: SmiQuery) -> list[Device]:
    """Add each GPU's NVLinks and their error counters; a host whose GPUs have none is
    asked once per driver, and the counters only where there are links."""
    if query.nvlink is False:
        return devices
    status = runner.run(list(NVLINK_STATUS_ARGV), timeout=COMMAND_TIMEOUT_S)
    links = parse_nvlink_status(status.stdout) if status.ok else {}
    if not any(links.values()):
        if status.ok:
            query.nvlink = False
        return devices
    query.nvlink = True
    errors = runner.run(list(NVLINK_ERRORS_ARGV), timeout=COMMAND_TIMEOUT_S)
    counts = parse_nvlink_errors(errors.stdout) if errors.ok else {}
    with_links = []
    for device in devices:
        found = counts.get(device.index, {})
        records = tuple(
            NvLink(link, state, *(found.get(link, {}).get(name) for name in NVLINK_COUNTERS))
            for link, state in sorted(links.get(device.index, {}).items())
        )
        with_links.append(replace(device, nvlink=records))
    return with_links


def is_nvidia_gpu_cdi_device(name: str) -> bool:
    """Whether a CDI device name ("nvidia.com/gpu=0", "=GPU-<uuid>", "=all") gives a GPU."""
    return name.strip().lower().startswith(NVIDIA_GPU_CDI_PREFIX)


def command_failure(result: CommandResult) -> str:
    """A one-line reason why a command gave no usable answer, for people to read.

    nvidia-smi prints its errors on stdout as well as stderr, so both are kept."""
    program = result.argv[0] if result.argv else "command"
    if result.error:
        # The runner's error usually names the program already ("nvidia-smi not found on PATH").
        if result.error.startswith(program):
            return _clip(result.error)
        return _clip(f"{program}: {result.error}")
    said = _output_text(result)
    reason = f"{program} exited with code {result.exit_code}"
    return _clip(f"{reason}: {said}" if said else reason)


def _output_text(result: CommandResult) -> str:
    """The non-empty lines of stdout then stderr, each once, on one line."""
    lines: list[str] = []
    for line in _without_traceback(result.stdout) + _without_traceback(result.stderr):
        line = line.strip()
        if line and line not in lines:
            lines.append(line)
    return " ".join(lines)


_TRACEBACK = "Traceback (most recent call last):"


def _without_traceback(text: str) -> list[str]:
    """The lines of `text`, a Python traceback in them cut down to its last line (the
    error): a wrapper script that crashed must not fill the overview with its frames."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == _TRACEBACK), None)
    if start is None:
        return lines
    rest = [line for line in lines[start + 1:] if line.strip()]
    return lines[:start] + rest[-1:]


def _clip(text: str) -> str:
    if len(text) <= _MAX_REASON_CHARS:
        return text
    return text[: _MAX_REASON_CHARS - 1] + "…"
