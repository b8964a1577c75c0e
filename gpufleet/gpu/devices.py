"""GPU detection: parse what nvidia-smi prints and combine it with Docker's facts.

Most nodes have no GPU, so a missing or failing nvidia-smi is an answer ("no GPU",
with the reason kept for the dashboard), never an exception.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass

from gpufleet.gpu.host import COMMAND_TIMEOUT_S, CommandResult, DockerInfo, Runner

SMI_QUERY_ARGV: list[str] = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,driver_version",
    "--format=csv,noheader,nounits",
]
SMI_FIELDS = 7

INSTALL_COMMAND = (
    "sudo apt-get install -y nvidia-container-toolkit"
    " && sudo nvidia-ctk runtime configure --runtime=docker"
    " && sudo systemctl restart docker"
)
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

_INT = re.compile(r"[0-9]+", re.ASCII)
_MIB = re.compile(r"([0-9]+)\s*MiB", re.ASCII)
_PERCENT = re.compile(r"([0-9]+)\s*%", re.ASCII)
# nvidia-smi prints "[N/A]", "[Not Supported]", "[Unknown Error]" ... where it has no number.
_PLACEHOLDER = re.compile(r"\[[^\]]*\]|N/A", re.ASCII)
# "WARNING: infoROM is corrupted at gpu 0000:4B:00.0" and the like: a word and a
# colon can never start a data row, whose first field is an index.
_NOTICE = re.compile(r"[A-Za-z][A-Za-z ]*:")


@dataclass(frozen=True)
class Device:
    """One GPU as reported by nvidia-smi. None means nvidia-smi gave no number
    (unified-memory parts such as GH200 report no memory, many report no utilization)."""

    index: int
    uuid: str
    name: str
    vram_total_mib: int | None
    vram_used_mib: int | None
    utilization_percent: int | None

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "vram_total_mib": self.vram_total_mib,
            "vram_used_mib": self.vram_used_mib,
            "utilization_percent": self.utilization_percent,
        }


class SmiParseError(ValueError):
    """nvidia-smi printed a row that cannot be read. Names the row and its text."""

    def __init__(self, row: int, text: str, problem: str):
        super().__init__(f"row {row}: {problem}: {text!r}")
        self.row = row
        self.text = text
        self.problem = problem


def parse_smi(text: str) -> tuple[str, list[Device]]:
    """Parse the CSV that nvidia-smi prints for SMI_QUERY_ARGV into (driver version, devices).

    Blank lines, notices ("WARNING: ...") and lines without a comma are skipped, as is a
    header row; every other line must be a readable 7-field row, else SmiParseError.
    Values with units ("143771 MiB", "100 %") are accepted because hosts differ.
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
            fields = [
                f.strip() for f in next(csv.reader([stripped], skipinitialspace=True))
            ]
        except (csv.Error, StopIteration) as exc:
            raise SmiParseError(number, line, f"not CSV ({exc})") from None
        if fields and fields[0].lower() == "index":
            continue  # a header row, printed when someone drops "noheader"
        if len(fields) != SMI_FIELDS:
            raise SmiParseError(
                number, line, f"expected {SMI_FIELDS} fields, got {len(fields)}"
            )
        index_text, uuid, name, total_text, used_text, util_text, row_driver = fields
        if not _INT.fullmatch(index_text):
            raise SmiParseError(number, line, f"index {index_text!r} is not a number")
        if not uuid:
            raise SmiParseError(number, line, "empty UUID")
        device = Device(
            index=int(index_text),
            uuid=uuid,
            name=name,
            vram_total_mib=_number(total_text, _MIB, number, line, "memory.total"),
            vram_used_mib=_number(used_text, _MIB, number, line, "memory.used"),
            utilization_percent=_number(
                util_text, _PERCENT, number, line, "utilization.gpu"
            ),
        )
        # Duplicates would make the ledger resolve one id to two GPUs.
        if device.index in seen_index:
            raise SmiParseError(
                number,
                line,
                f"index {device.index} also on row {seen_index[device.index]}",
            )
        if uuid.lower() in seen_uuid:
            raise SmiParseError(
                number, line, f"UUID also on row {seen_uuid[uuid.lower()]}"
            )
        if devices and row_driver != driver:
            raise SmiParseError(
                number, line, f"driver {row_driver!r} differs from {driver!r}"
            )
        seen_index[device.index] = number
        seen_uuid[uuid.lower()] = number
        driver = row_driver
        devices.append(device)
    return driver, devices


def _number(
    value: str, with_unit: re.Pattern[str], row: int, line: str, field: str
) -> int | None:
    """An integer field, bare or with its unit; None for nvidia-smi's placeholders."""
    if _PLACEHOLDER.fullmatch(value):
        return None
    if _INT.fullmatch(value):
        return int(value)
    match = with_unit.fullmatch(value)
    if match:
        return int(match.group(1))
    raise SmiParseError(row, line, f"{field} {value!r} is not a number")


@dataclass(frozen=True)
class Info:
    """A node's GPU capability snapshot. `no_gpu_reason` says why `present` is False."""

    present: bool
    driver_version: str
    devices: tuple[Device, ...]
    runtime_installed: bool
    cdi_devices: tuple[str, ...] = ()
    no_gpu_reason: str = ""

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def total_vram_mib(self) -> int:
        """VRAM summed over devices; a device that reports no memory counts as 0."""
        return sum(d.vram_total_mib or 0 for d in self.devices)

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


def detect(runner: Runner, docker_info: DockerInfo) -> Info:
    """Return the node's GPU snapshot from nvidia-smi (run through `runner`, which is
    expected to set LC_ALL=C) and Docker's /info facts. Never raises for a host that
    has no GPU or a broken one: the reason ends up in `no_gpu_reason`."""
    runtime_installed = any(name.lower() == "nvidia" for name in docker_info.runtimes)
    cdi_devices = tuple(
        d for d in docker_info.cdi_devices if is_nvidia_gpu_cdi_device(d)
    )

    def absent(reason: str) -> Info:
        return Info(
            present=False,
            driver_version="",
            devices=(),
            runtime_installed=runtime_installed,
            cdi_devices=cdi_devices,
            no_gpu_reason=reason,
        )

    result = runner.run(list(SMI_QUERY_ARGV), timeout=COMMAND_TIMEOUT_S)
    if not result.ok:
        return absent(command_failure(result))
    try:
        driver, devices = parse_smi(result.stdout)
    except SmiParseError as exc:
        return absent(f"nvidia-smi output could not be read: {exc}")
    if not devices:
        said = _output_text(result)
        return absent(
            f"nvidia-smi listed no GPUs: {said}"
            if said
            else "nvidia-smi listed no GPUs"
        )
    return Info(
        present=True,
        driver_version=driver,
        devices=tuple(devices),
        runtime_installed=runtime_installed,
        cdi_devices=cdi_devices,
    )


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
    for line in (result.stdout + "\n" + result.stderr).splitlines():
        line = line.strip()
        if line and line not in lines:
            lines.append(line)
    return " ".join(lines)


def _clip(text: str) -> str:
    if len(text) <= _MAX_REASON_CHARS:
        return text
    return text[: _MAX_REASON_CHARS - 1] + "…"
