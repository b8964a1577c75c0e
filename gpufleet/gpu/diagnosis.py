"""Host diagnosis: the doctor's findings about a node's GPU container stack.

Driver, per-GPU memory, the NVIDIA Container Toolkit, CDI specs and how Docker can
attach GPUs, each as one Finding with a status and, where there is one, a fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.gpu.devices import INSTALL_COMMAND, Device, Info, command_failure, detect
from gpufleet.gpu.host import COMMAND_TIMEOUT_S, DockerFacts, Runner


class Status(StrEnum):
    """Finding statuses, matching the doctor report's vocabulary. Declared in
    severity order: this order is the one ranking of ok < warn < fail."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        """0 for ok, 1 for warn, 2 for fail: sort by it, worst last."""
        return list(Status).index(self)

    @classmethod
    def worst(cls, statuses: Iterable[str]) -> Status:
        """The most severe of `statuses` (ok when there are none)."""
        return max((cls(s) for s in statuses), key=lambda s: s.rank, default=cls.OK)



class Attach(StrEnum):
    """How a host can give containers a GPU."""

    CDI = "cdi"
    LEGACY = "legacy"
    NONE = "none"



DEFAULT_VRAM_WARN_PERCENT = 90.0
TOOLKIT_ARGV = ["nvidia-ctk", "--version"]

DRIVER_HINT = (
    "No NVIDIA driver detected. On Ubuntu run ubuntu-drivers install"
    " (or apt-get install nvidia-driver-XXX), then reboot."
)
# Writes the NVIDIA CDI spec that CDI attach needs.
CDI_GENERATE_COMMAND = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
# The remedy when a spec exists but Docker lists no CDI devices.
CDI_ENABLE_HINT = (
    "Upgrade Docker to 28.3 or later, which enables CDI and lists its devices;"
    ' on Docker 25-28.2 set "features": {"cdi": true} in /etc/docker/daemon.json'
    " and restart Docker."
)


@dataclass(frozen=True)
class Finding:
    """One diagnosed aspect of a host's GPU setup. `fix` is a command or remedy, or empty."""

    code: str
    name: str
    status: Status
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        # Accept the plain strings too, and refuse anything outside the vocabulary.
        object.__setattr__(self, "status", Status(self.status))

    def to_dict(self) -> dict:
        data = {
            "code": self.code,
            "name": self.name,
            "status": str(self.status),
            "message": self.message,
        }
        if self.fix:
            data["fix"] = self.fix
        return data


@dataclass(frozen=True)
class HostDiagnosis:
    """The detailed GPU picture of one host, as the doctor reports it."""

    info: Info
    toolkit_version: str
    cdi_spec_files: tuple[str, ...]
    cdi_devices: tuple[str, ...]
    attach: Attach
    findings: tuple[Finding, ...]
    docker_error: str = ""

    @property
    def failed(self) -> bool:
        """Whether any finding fails (the doctor then exits 1)."""
        return any(f.status == Status.FAIL for f in self.findings)

    @property
    def worst_status(self) -> Status:
        return Status.worst(f.status for f in self.findings)

    def to_dict(self, node: str) -> dict:
        """The doctor's JSON report for `node`."""
        return {
            "node": node,
            "present": self.info.present,
            "driver_version": self.info.driver_version,
            "devices": [d.to_dict() for d in self.info.devices],
            "runtime_installed": self.info.runtime_installed,
            "toolkit_version": self.toolkit_version,
            "cdi_spec_files": list(self.cdi_spec_files),
            "cdi_devices": list(self.cdi_devices),
            "attach": str(self.attach),
            "findings": [f.to_dict() for f in self.findings],
        }


def attach_mode(info: Info) -> Attach:
    """CDI when Docker lists NVIDIA CDI devices, else the legacy nvidia runtime, else none."""
    if not info.present:
        return Attach.NONE
    if info.cdi_devices:
        return Attach.CDI
    if info.runtime_installed:
        return Attach.LEGACY
    return Attach.NONE


def diagnose_host(
    runner: Runner,
    docker: DockerFacts,
    cdi_spec_files: Sequence[str],
    vram_warn_percent: float = DEFAULT_VRAM_WARN_PERCENT,
) -> HostDiagnosis:
    """Inspect this host's GPU stack. `cdi_spec_files` are the NVIDIA spec files the host
    side found (see gpufleet.gpu.host.list_cdi_spec_files). A VRAM warning level
    outside 0 < v <= 100 is ignored in favour of the default."""
    docker_info = docker.info()
    info = detect(runner, docker_info)
    toolkit_version, toolkit_reason = _toolkit(runner)
    spec_files = tuple(dict.fromkeys(cdi_spec_files))  # without duplicates, order kept
    attach = attach_mode(info)
    if not info.present:
        findings = [
            Finding(
                "driver",
                "NVIDIA driver",
                Status.FAIL,
                f"No NVIDIA GPU detected: {info.no_gpu_reason or 'nvidia-smi gave no answer'}",
                DRIVER_HINT,
            )
        ]
    else:
        findings = [_driver_finding(info)]
        findings += [
            _gpu_finding(d, _warn_level(vram_warn_percent)) for d in info.devices
        ]
        findings.append(_toolkit_finding(toolkit_version, toolkit_reason))
        findings.append(_cdi_finding(info, spec_files))
        findings.append(_runtime_finding(info, docker_info.error))
        findings.append(_attach_finding(attach))
    return HostDiagnosis(
        info=info,
        toolkit_version=toolkit_version,
        cdi_spec_files=spec_files,
        cdi_devices=info.cdi_devices,
        attach=attach,
        findings=tuple(findings),
        docker_error=docker_info.error,
    )


def _warn_level(percent: float) -> float:
    # `not (0 < v <= 100)` also catches NaN.
    try:
        value = float(percent)
    except (TypeError, ValueError):
        return DEFAULT_VRAM_WARN_PERCENT
    if not (0 < value <= 100):
        return DEFAULT_VRAM_WARN_PERCENT
    return value


def _toolkit(runner: Runner) -> tuple[str, str]:
    """(first line of `nvidia-ctk --version`, "") or ("", why there is none)."""
    result = runner.run(list(TOOLKIT_ARGV), timeout=COMMAND_TIMEOUT_S)
    if not result.ok:
        return "", command_failure(result)
    for line in result.stdout.splitlines():
        if line.strip():
            return line.strip(), ""
    return "", "nvidia-ctk --version printed nothing"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _driver_finding(info: Info) -> Finding:
    return Finding(
        "driver",
        "NVIDIA driver",
        Status.OK,
        f"Driver {info.driver_version or 'version unknown'}, {_plural(info.count, 'GPU')}",
    )


def _gpu_finding(device: Device, warn_percent: float) -> Finding:
    code, name = f"gpu{device.index}", f"GPU {device.index} ({device.name})"
    total, used = device.vram_total_mib, device.vram_used_mib
    if not total or used is None:  # also total 0: no share of it can be computed
        return Finding(
            code, name, Status.OK, "Memory not reported by nvidia-smi (unified memory?)"
        )
    percent = used * 100 / total
    message = f"{used / 1024:.1f} of {total / 1024:.1f} GiB in use ({percent:.0f}%)"
    if percent >= warn_percent:
        return Finding(
            code,
            name,
            Status.WARN,
            f"{message}, at or above the {warn_percent:g}% warning level",
        )
    return Finding(code, name, Status.OK, message)


def _toolkit_finding(version: str, reason: str) -> Finding:
    if version:
        return Finding("toolkit", "NVIDIA Container Toolkit", Status.OK, version)
    return Finding(
        "toolkit",
        "NVIDIA Container Toolkit",
        Status.WARN,
        f"NVIDIA Container Toolkit not found: {reason}",
        INSTALL_COMMAND,
    )


def _cdi_finding(info: Info, spec_files: tuple[str, ...]) -> Finding:
    if info.cdi_devices:
        return Finding(
            "cdi",
            "CDI",
            Status.OK,
            f"Docker lists {_plural(len(info.cdi_devices), 'NVIDIA CDI device')}: {', '.join(info.cdi_devices)}",
        )
    if spec_files:
        return Finding(
            "cdi",
            "CDI",
            Status.WARN,
            f"CDI spec {', '.join(spec_files)} exists but Docker lists no CDI devices",
            CDI_ENABLE_HINT,
        )
    return Finding(
        "cdi",
        "CDI",
        Status.OK,
        "No NVIDIA CDI spec; generate one to let Docker attach GPUs through CDI",
        CDI_GENERATE_COMMAND,
    )


def _runtime_finding(info: Info, docker_error: str) -> Finding:
    if info.runtime_installed:
        return Finding(
            "runtime",
            "Docker nvidia runtime",
            Status.OK,
            "nvidia runtime registered with Docker",
        )
    if info.cdi_devices:
        return Finding(
            "runtime",
            "Docker nvidia runtime",
            Status.OK,
            "nvidia runtime not registered; not needed, Docker attaches GPUs through CDI",
        )
    if docker_error:
        # The host side may already phrase it ("Docker at unix://... is unreachable: ...").
        if "unreachable" in docker_error.lower():
            message = docker_error
        else:
            message = f"Docker is unreachable: {docker_error}"
    else:
        message = "nvidia runtime not registered with Docker and Docker lists no NVIDIA CDI devices"
    return Finding(
        "runtime", "Docker nvidia runtime", Status.WARN, message, INSTALL_COMMAND
    )


def _attach_finding(attach: Attach) -> Finding:
    if attach == Attach.NONE:
        return Finding(
            "attach",
            "GPU attach",
            Status.FAIL,
            "Docker cannot give containers a GPU: no nvidia runtime and no NVIDIA CDI devices",
            INSTALL_COMMAND,
        )
    how = "CDI devices" if attach == Attach.CDI else "the legacy nvidia runtime"
    return Finding(
        "attach",
        "GPU attach",
        Status.OK,
        f"Containers get GPUs through {how} ({attach})",
    )
