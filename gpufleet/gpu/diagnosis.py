"""Host diagnosis: the doctor's findings about a node's GPU container stack.

Driver, per-GPU memory, the NVIDIA Container Toolkit, CDI specs and how Docker can
attach GPUs, each as one Finding with a status and, where there is one, a fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum

from gpufleet.gpu import links, processes
from gpufleet.gpu import throttle as throttles
from gpufleet.gpu import xid as xids
from gpufleet.gpu.devices import Device, Info, SmiQuery, command_failure, detect
from gpufleet.gpu.findings import Finding, Status
from gpufleet.gpu.interfaces import COMMAND_TIMEOUT_S, DockerFacts, DockerInfo, Runner
from gpufleet.gpu.ledger import Ledger
from gpufleet.gpu.remedies import CDI_GENERATE_COMMAND, INSTALL_COMMAND, PERSISTENCE_COMMAND
from gpufleet.gpu.throttle import DEFAULT_THROTTLE_WARN_SHARE, ThrottleHistory
from gpufleet.gpu.usage import IdleRule


class Attach(StrEnum):
    """How a host can give containers a GPU."""

    CDI = "cdi"
    LEGACY = "legacy"
    NONE = "none"



DEFAULT_VRAM_WARN_PERCENT = 90.0
DEFAULT_TEMPERATURE_WARN_C = 85
# The share of the last hour a GPU may be held down by power capping or heat (gpu/throttle.py).
KERNEL_LOG_HINT = (
    "Let the agent read the kernel log: run it as root or with CAP_SYSLOG,"
    " or allow it for everyone with sudo sysctl -w kernel.dmesg_restrict=0"
)
TOOLKIT_ARGV = ["nvidia-ctk", "--version"]

DRIVER_HINT = (
    "No NVIDIA driver detected. On Ubuntu run ubuntu-drivers install"
    " (or apt-get install nvidia-driver-XXX), then reboot."
)
# What to do for each way nvidia-smi fails, found by what it printed; the first
# match wins. A missing driver is the fallback (DRIVER_HINT).
SMI_FAILURE_REMEDIES: tuple[tuple[str, str], ...] = (
    (
        "version mismatch",
        "The kernel module and the driver's libraries are different versions (usually after a driver"
        " upgrade): reboot, or reload the modules: sudo rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia"
        " && sudo modprobe nvidia",
    ),
    (
        "couldn't communicate with the nvidia driver",
        "The NVIDIA kernel module is not loaded: sudo modprobe nvidia. If that fails, rebuild it for the"
        " running kernel (sudo dkms autoinstall) or, with Secure Boot on, enrol its signing key (mokutil --import).",
    ),
    (
        "no devices were found",
        "The driver sees no GPU: check the card is on the PCIe bus (lspci -nn | grep -i nvidia),"
        " reseat it and check its power cables.",
    ),
    (
        "libnvidia-ml",
        "The driver's user-space libraries are missing: reinstall them to match the kernel module"
        " (e.g. sudo apt-get install --reinstall libnvidia-compute-<driver branch>).",
    ),
    ("nvml shared library", "The driver's user-space libraries are missing: reinstall the NVIDIA driver."),
    ("gpu is lost", xids.LOST_GPU),
    ("fallen off the bus", xids.INSPECT),
)


def smi_failure_remedy(reason: str) -> str:
    said = reason.lower()
    return next((remedy for words, remedy in SMI_FAILURE_REMEDIES if words in said), DRIVER_HINT)


# The remedy when a spec exists but Docker lists no CDI devices.
CDI_ENABLE_HINT = (
    "Upgrade Docker to 28.3 or later, which enables CDI and lists its devices;"
    ' on Docker 25-28.2 set "features": {"cdi": true} in /etc/docker/daemon.json'
    " and restart Docker."
)



def docker_unreachable_remedy(url: str = "") -> str:
    """What to check when Docker does not answer: the daemon, the address asked, the
    socket's permissions. Installing the toolkit would not help, so it is not said."""
    where = f"DOCKER_HOST is {url}" if url else "DOCKER_HOST is unset, so unix:///var/run/docker.sock"
    return (
        "Docker does not answer: is dockerd running (sudo systemctl status docker)?"
        f" Is DOCKER_HOST right ({where})?"
        " May the agent's user open the socket (add it to group docker: sudo usermod -aG docker USER)?"
    )


@dataclass(frozen=True)
class HostDiagnosis:
    """The detailed GPU picture of one host, as the doctor reports it."""

    info: Info
    toolkit_version: str
    cdi_spec_files: tuple[str, ...]
    cdi_devices: tuple[str, ...]
    attach: Attach
    findings: tuple[Finding, ...]

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
    *,
    query: SmiQuery | None = None,
    temperature_warn_c: float = DEFAULT_TEMPERATURE_WARN_C,
    xid_window_hours: float = xids.DEFAULT_XID_WINDOW_HOURS,
    now: datetime | None = None,
    cgroup_of: Callable[[int], str | None] = lambda pid: None,
    idle_rule=None,
    throttle: ThrottleHistory | None = None,
    throttle_warn_share: float = DEFAULT_THROTTLE_WARN_SHARE,
) -> HostDiagnosis:
    """Inspect this host's GPU stack. `cdi_spec_files` are the NVIDIA spec files the host
    side found (see gpufleet.agent.adapters.list_cdi_spec_files). A VRAM warning level
    outside 0 < v <= 100 is ignored in favour of the default. `query` remembers the
    nvidia-smi fields this driver rejects (keep one per process). `cgroup_of(pid)` is a
    process's cgroup text, None when unknown: how a GPU's processes are matched to containers.
    `idle_rule` (gpu.IdleRule, its defaults when None) says which GPUs are busy, where a
    downtrained PCIe link matters; `query` also remembers the NVLink counters between calls.
    `throttle` remembers each GPU's last hour of throttling (keep one per process): a GPU
    held down for more than `throttle_warn_share` of it warns (gpu/throttle.py)."""
    now = now or datetime.now(UTC)
    docker_info = docker.info()
    info = detect(runner, docker_info, query)
    toolkit_version, toolkit_reason = _toolkit(runner)
    spec_files = tuple(dict.fromkeys(cdi_spec_files))  # without duplicates, order kept
    attach = attach_mode(info)
    if not info.present:
        reason = info.no_gpu_reason or "nvidia-smi gave no answer"
        findings = [
            Finding("driver", "NVIDIA driver", Status.FAIL, f"No NVIDIA GPU detected: {reason}", smi_failure_remedy(reason))
        ]
    else:
        log = xids.read_kernel_log(runner, now)
        per_gpu, unmatched = xids.count_xids(log.events, info.devices, now, xid_window_hours)
        on_gpu, attached = _processes(runner, docker, cgroup_of, info)
        info = replace(
            info,
            devices=tuple(
                replace(
                    d,
                    xid_errors=per_gpu.get(d.index, ()),
                    processes=tuple(on_gpu.get(d.uuid, ())),
                    attached_idle=tuple(attached.get(d.uuid, ())),
                )
                for d in info.devices
            ),
        )
        findings = [_driver_finding(info)]
        findings += [_lost_finding(lost) for lost in info.lost_gpus]
        busy = (idle_rule or IdleRule()).busy
        memory = query.links if query is not None else None
        if throttle is not None:
            throttle.remember(info.devices, now)
        for device in info.devices:
            findings.append(_gpu_finding(device, vram_warn_level(vram_warn_percent)))
            findings += _gpu_health_findings(device, temperature_warn_c)
            held = throttles.throttle_finding(device, throttle.of(device.uuid), now, throttle_warn_share) if throttle else None
            findings += [f for f in (links.pcie_finding(device, busy),
                                     links.nvlink_finding(device, info.devices, memory, now), held) if f is not None]
        if memory is not None:
            memory.remember(info.devices, now)
        findings += _unmatched_xid_findings(unmatched)
        findings += _persistence_findings(info.devices)
        findings += _kernel_log_findings(log)
        findings.append(_toolkit_finding(toolkit_version, toolkit_reason))
        findings.append(_cdi_finding(info, spec_files, docker_info))
        findings.append(_runtime_finding(info, docker_info))
        findings.append(_attach_finding(attach, docker_info))
    return HostDiagnosis(
        info=info,
        toolkit_version=toolkit_version,
        cdi_spec_files=spec_files,
        cdi_devices=info.cdi_devices,
        attach=attach,
        findings=tuple(findings),
    )


def _processes(runner: Runner, docker: DockerFacts, cgroup_of: Callable[[int], str | None], info: Info) -> tuple[dict, dict]:
    """Compute processes per GPU UUID, with their containers, and the containers
    attached to a GPU with no process on it yet; none when nvidia-smi cannot list
    processes (the GPUs themselves were already found)."""
    result = runner.run(list(processes.COMPUTE_APPS_ARGV), timeout=COMMAND_TIMEOUT_S)
    if not result.ok:
        return {}, {}
    containers = processes.containers_from_payload(docker.containers())
    busy = processes.attribute(processes.parse_compute_apps(result.stdout), containers, cgroup_of)
    candidates = processes.idle_candidates(containers, busy)
    if not candidates:
        return busy, {}
    ledger = Ledger(info, ())  # the ledger's rule for what a device id names

    def resolve(device_id: str) -> str | None:
        device = ledger.resolve(device_id)
        return device.uuid if device else None

    inspected = docker.inspect(candidates)
    return busy, processes.attached_idle(containers, inspected, resolve, [d.uuid for d in info.devices])


def vram_warn_level(percent: float) -> float:
    """The VRAM share (%) at which a GPU's finding warns: `percent`, or the default
    when it is outside 0 < v <= 100. The dashboard's VRAM bars turn amber at the same level."""
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
    message = f"Driver {info.driver_version or 'version unknown'}, {_plural(info.count, 'GPU')}"
    if info.smi_notice:
        return Finding(
            "driver",
            "NVIDIA driver",
            Status.WARN,
            f"{message}, but nvidia-smi reported a problem: {info.smi_notice}",
            smi_failure_remedy(info.smi_notice) if info.lost_gpus else "",
        )
    return Finding("driver", "NVIDIA driver", Status.OK, message)


def _gpu_label(device: Device) -> str:
    """"GPU 3 (NVIDIA H200, PCI 00000000:9B:00.0)": index and address, as admins find it."""
    where = f", PCI {device.pci_bus_id}" if device.pci_bus_id else ""
    return f"GPU {device.index} ({device.name}{where})"


def _lost_finding(lost) -> Finding:
    return Finding(
        f"lost:{lost.pci_bus_id}"[:64],
        f"GPU at PCI {lost.pci_bus_id}",
        Status.FAIL,
        f"nvidia-smi cannot reach the GPU at PCI {lost.pci_bus_id}: {lost.reason}",
        xids.LOST_GPU,
    )


def _gpu_health_findings(device: Device, temperature_warn_c: float) -> list[Finding]:
    """ECC, thermal, power brake and Xid problems of one GPU; nothing when all is well."""
    label, code = _gpu_label(device), f"gpu{device.index}"
    throttle = set(device.throttle_reasons or ())
    findings = []
    if device.ecc_uncorrected_volatile or device.remapped_rows_failure:
        what = []
        if device.ecc_uncorrected_volatile:
            what.append(f"{device.ecc_uncorrected_volatile} uncorrectable ECC errors since the last reset")
        if device.remapped_rows_failure:
            what.append("row remapping failed (no spare rows left)")
        findings.append(
            Finding(f"{code}.ecc", label, Status.FAIL, "; ".join(what) + ": its memory cannot be trusted", xids.INSPECT)
        )
    elif device.remapped_rows_pending or device.retired_pages_pending:
        findings.append(
            Finding(
                f"{code}.ecc",
                label,
                Status.WARN,
                "A memory row remap or page retirement is pending",
                "Reset the GPU or reboot to apply it (nvidia-smi -r -i <index> once it is idle).",
            )
        )
    # The driver sets hw_slowdown whenever hardware slows the clocks, a power brake
    # included: with the brake active, only hw_thermal_slowdown says it is heat.
    hardware = throttle & {"hw_slowdown", "hw_thermal_slowdown"}
    if "hw_power_brake_slowdown" in throttle:
        hardware -= {"hw_slowdown"}
    if hardware:
        findings.append(
            Finding(
                f"{code}.thermal",
                label,
                Status.FAIL,
                f"Hardware slowdown active ({', '.join(sorted(hardware))}){_temperature(device)}",
                "Check cooling and airflow (fans, blocked inlets, data-centre temperature), then the power supply.",
            )
        )
    elif "sw_thermal_slowdown" in throttle or (device.temperature_c or 0) >= temperature_warn_c:
        why = "Thermal slowdown active" if "sw_thermal_slowdown" in throttle else "Running hot"
        findings.append(
            Finding(
                f"{code}.thermal",
                label,
                Status.WARN,
                f"{why}{_temperature(device)}; warning level {temperature_warn_c:g} °C",
                "Check cooling and airflow (fans, blocked inlets, data-centre temperature).",
            )
        )
    if "hw_power_brake_slowdown" in throttle:
        findings.append(
            Finding(
                f"{code}.power",
                label,
                Status.FAIL,
                "Power brake slowdown active: the system asserted the external power brake",
                "Check the power supplies and the chassis power-brake signal.",
            )
        )
    if device.xid_errors:
        findings.append(_xid_finding(f"{code}.xid", label, device.xid_errors))
    return findings


def _temperature(device: Device) -> str:
    return f" at {device.temperature_c} °C" if device.temperature_c is not None else ""


def _xid_finding(code: str, label: str, counts) -> Finding:
    worst = max(counts, key=lambda c: (xids.xid_code(c.xid).fails, c.count))
    parts = [f"Xid {c.xid} ×{c.count} ({c.description})" for c in counts]
    last = max((c.last_seen for c in counts if c.last_seen), default=None)
    status = Status.FAIL if any(xids.xid_code(c.xid).fails for c in counts) else Status.WARN
    message = "Kernel log: " + ", ".join(parts) + (f"; last at {last}" if last else "")
    return Finding(code, label, status, message, xids.xid_code(worst.xid).action)


def _unmatched_xid_findings(events) -> list[Finding]:
    """Xids naming a PCI address that nvidia-smi did not list (a GPU that is gone)."""
    by_pci: dict[str, list] = {}
    for event in events:
        by_pci.setdefault(event.pci, []).append(event)
    findings = []
    for pci, found in by_pci.items():
        counts = {}
        for event in found:
            counts[event.xid] = counts.get(event.xid, 0) + 1
        summary = [
            xids.XidCount(code, n, None, xids.xid_code(code).description) for code, n in sorted(counts.items())
        ]
        findings.append(_xid_finding(f"xid:{pci}"[:64], f"GPU at PCI {pci} (not listed by nvidia-smi)", summary))
    return findings


def _persistence_findings(devices: Sequence[Device]) -> list[Finding]:
    # Windows reports no persistence mode (None): only an explicit "Disabled" counts.
    off = [d for d in devices if d.persistence_mode is False]
    if not off:
        return []
    which = ", ".join(f"{d.index} at PCI {d.pci_bus_id}" if d.pci_bus_id else str(d.index) for d in off)
    return [
        Finding(
            "persistence",
            "Persistence mode",
            Status.WARN,
            f"Persistence mode is off on {_plural(len(off), 'GPU')} ({which}):"
            " every nvidia-smi call and CUDA start then re-initialises the driver, taking seconds",
            PERSISTENCE_COMMAND,
        )
    ]


def _kernel_log_findings(log: xids.KernelLog) -> list[Finding]:
    if not log.error:
        return []
    return [
        Finding(
            "kernel-log",
            "Kernel log (Xid errors)",
            Status.WARN,
            f"Cannot read the kernel log, so Xid errors are not checked: {log.error}",
            KERNEL_LOG_HINT if log.denied else "Install util-linux's dmesg on the node.",
        )
    ]


def _gpu_finding(device: Device, warn_percent: float) -> Finding:
    code, name = f"gpu{device.index}", _gpu_label(device)
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


def _cdi_finding(info: Info, spec_files: tuple[str, ...], docker: DockerInfo) -> Finding:
    if info.cdi_devices:
        return Finding(
            "cdi",
            "CDI",
            Status.OK,
            f"Docker lists {_plural(len(info.cdi_devices), 'NVIDIA CDI device')}: {', '.join(info.cdi_devices)}",
        )
    if spec_files and docker.error:
        return Finding(
            "cdi",
            "CDI",
            Status.WARN,
            f"CDI spec {', '.join(spec_files)} exists, but Docker does not answer, so its CDI devices are unknown",
            docker_unreachable_remedy(docker.url),
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


def _runtime_finding(info: Info, docker: DockerInfo) -> Finding:
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
    if docker.error:
        # The host side may already phrase it ("Docker at unix://... is unreachable: ...").
        said = docker.error if "unreachable" in docker.error.lower() else f"Docker is unreachable: {docker.error}"
        return Finding(
            "runtime",
            "Docker nvidia runtime",
            Status.WARN,
            f"{said}; whether the nvidia runtime is registered is unknown",
            docker_unreachable_remedy(docker.url),
        )
    return Finding(
        "runtime",
        "Docker nvidia runtime",
        Status.WARN,
        "nvidia runtime not registered with Docker and Docker lists no NVIDIA CDI devices",
        INSTALL_COMMAND,
    )


def _attach_finding(attach: Attach, docker: DockerInfo) -> Finding:
    if attach == Attach.NONE and docker.error:
        return Finding(
            "attach",
            "GPU attach",
            Status.FAIL,
            "Docker does not answer, so it cannot give containers a GPU",
            docker_unreachable_remedy(docker.url),
        )
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


def problem_text(findings: Iterable[Finding], limit: int = 300) -> str:
    """The worst finding in words (the first of the worst, in the doctor's order), with
    how many more there are: a node's problem line on the overview."""
    problems = [f for f in findings if f.status != Status.OK]
    if not problems:
        return ""
    worst = max(problems, key=lambda f: Status(f.status).rank)  # max keeps the first of equals
    text = f"{worst.name}: {worst.message}"
    more = len(problems) - 1
    suffix = f" (+{more} more)" if more else ""
    return text[: limit - len(suffix) - 1] + "…" + suffix if len(text) + len(suffix) > limit else text + suffix
