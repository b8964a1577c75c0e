"""What the domain asks of a host, and the shapes of its answers: a command `Runner`
and its `CommandResult`, the Docker Engine facts (`DockerFacts`, `DockerInfo`) and the
rules for reading what they return. The agent implements them on the real host
(gpufleet/agent/adapters.py); tests swap in their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

COMMAND_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CommandResult:
    """What one host command did. `error` is set when it never produced an exit code
    (binary missing, not executable, timed out); `exit_code` is None then."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    # The command printed more than OUTPUT_LIMIT on a stream; the rest was thrown away.
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.error and self.exit_code == 0


class Runner(Protocol):
    def run(
        self, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S
    ) -> CommandResult: ...


@dataclass(frozen=True)
class DockerInfo:
    """The facts of one `GET /info`. `error` says why Docker could not be asked; `url`
    is the address that was asked (DOCKER_HOST's value), so a remedy can name it."""

    runtimes: tuple[str, ...] = ()
    cdi_devices: tuple[str, ...] = ()
    error: str = ""
    url: str = ""


class DockerFacts(Protocol):
    def info(self) -> DockerInfo: ...

    def containers(self) -> object:
        """The running containers as `GET /containers/json` answers; [] when Docker
        cannot be asked (info() already says why)."""
        ...

    def inspect(self, container_ids: Sequence[str]) -> dict[str, object]:
        """`GET /containers/<id>/json` for each ID, by ID; one that cannot be asked
        (gone meanwhile, Docker unreachable) is left out."""
        ...


DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
NVIDIA_CDI_PREFIX = "nvidia.com/gpu="


def docker_info_from_payload(payload: object) -> DockerInfo:
    """Runtimes and NVIDIA CDI devices from a decoded Engine API `/info` body."""
    if not isinstance(payload, dict):
        raise TypeError(f"/info answered {type(payload).__name__}, not an object")
    runtimes = payload.get("Runtimes") or {}
    if not isinstance(runtimes, dict):
        raise TypeError("/info key Runtimes is not an object")
    devices = payload.get("DiscoveredDevices") or []
    if not isinstance(devices, list):
        raise TypeError("/info key DiscoveredDevices is not a list")
    cdi: list[str] = []
    for entry in devices:
        if not isinstance(entry, dict):
            continue
        source, ident = entry.get("Source"), entry.get("ID")
        if (
            isinstance(source, str)
            and source.lower() == "cdi"
            and isinstance(ident, str)
            and ident.startswith(NVIDIA_CDI_PREFIX)
            and ident not in cdi
        ):
            cdi.append(ident)
    return DockerInfo(runtimes=tuple(str(k) for k in runtimes), cdi_devices=tuple(cdi))


DEFAULT_CDI_SPEC_DIRS: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
CDI_SPEC_SUFFIXES: tuple[str, ...] = (".yaml", ".yml", ".json")
CDI_SPEC_MARKER = "nvidia.com/gpu"


def is_cdi_spec_name(name: str) -> bool:
    """Whether a file in a CDI spec dir is one Docker would load as a spec."""
    return name.endswith(CDI_SPEC_SUFFIXES)


def cdi_spec_mentions_gpu(text: str) -> bool:
    """Whether a CDI spec's content is about NVIDIA GPUs (kind nvidia.com/gpu)."""
    return CDI_SPEC_MARKER in text
