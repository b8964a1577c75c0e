"""Recorded host outputs under tests/fakes/data/, by short name: the one set of
recordings for both fake hosts (the executables in bin/ and the in-memory runner
in memory.py).

Besides the short names below, the domain tests read these by file name:
smi-2x-mixed-560.csv and smi-8x-h200-570.195.csv (the same hosts on other
drivers), smi-2x-k80-util-placeholders.csv ("[Not Supported]" and "[N/A]"
utilization), smi-1x-gh200-memory-na.csv (unified memory: no memory figures),
smi-2x-warnings-around-rows.txt, smi-garbage-row.csv (a row that cannot be read),
smi-8x-a40-with-units.csv (units despite nounits), and health/ (the full health
query of several GPU families, with a header naming the fields the driver knows;
kernel logs in each prefix format; an `nvidia-smi -L` of a MIG host).

nvidia-smi files are in the format of gpufleet's own query (DESIGN.md):
index, uuid, name, memory.total, memory.used, utilization.gpu, driver_version
with --format=csv,noheader,nounits.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
BIN_DIR = Path(__file__).resolve().parent / "bin"

SMI_OUTPUTS: dict[str, str] = {
    "h200": "smi-8x-h200.csv",  # 8x NVIDIA H200, 143771 MiB, driver 570.133.20
    "a40": "smi-8x-a40.csv",  # 8x NVIDIA A40, 46068 MiB, driver 550.127.08
    "mixed": "smi-2x-mixed.csv",  # RTX 4080 SUPER + RTX 3090, driver 550.120
    "util-na": "smi-util-na.csv",  # 2x H200, GPU 0 utilization "[N/A]"
    "util-not-supported": "smi-util-not-supported.csv",  # 1x H200, "[Not Supported]"
    "memory-na": "smi-memory-na.csv",  # 2x H200, GPU 1 memory.used "[N/A]" -> parse error
    "warnings": "smi-warnings.csv",  # 2x H200 rows between "WARNING: infoROM ..." lines
    "garbage": "smi-garbage.txt",  # not CSV (HTML, control bytes, a 2-field row)
    "empty": "smi-empty.txt",  # nothing at all
    "error-9": "smi-error-exit9.txt",  # "couldn't communicate with the NVIDIA driver" (exit 9)
    "error-18": "smi-error-exit18.txt",  # "Driver/library version mismatch" (exit 18)
}

#: exit code real nvidia-smi gives with each recorded error text
SMI_ERROR_EXIT: dict[str, int] = {"error-9": 9, "error-18": 18}

CTK_OUTPUTS: dict[str, str] = {
    "1.18.2": "ctk-1.18.2.txt",
    "1.12.0": "ctk-1.12.0.txt",
}

CDI_SPEC = "cdi-nvidia.yaml"  # nvidia-ctk cdi generate output (T4, trimmed)

H200_UUIDS: tuple[str, ...] = (
    "GPU-a44622e3-2296-6285-0a86-84d0f6c67900",
    "GPU-4f31bb83-f8dc-d0af-029e-bc4356e6afeb",
    "GPU-4e9e74b7-4977-f04d-3af3-ccfe5f570e90",
    "GPU-02dbe542-8a6f-11a4-7c2a-486b7d4e9092",
    "GPU-cb449822-5571-be90-8303-e7558da3ea66",
    "GPU-8e137fa6-c3d9-6980-7733-0d8df296756e",
    "GPU-d9337494-6060-1440-039f-4654245b5764",
    "GPU-28780eb0-24d5-1f13-59b8-ae5c23617a72",
)


def data_path(name: str) -> Path:
    """Path of a recorded file: a short name from SMI_OUTPUTS/CTK_OUTPUTS or a file name."""
    file = SMI_OUTPUTS.get(name) or CTK_OUTPUTS.get(name) or name
    path = DATA_DIR / file
    if not path.is_file():
        raise KeyError(f"no recorded output {name!r} in {DATA_DIR}")
    return path


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA_DIR / name).read_text(encoding="utf-8"))


def docker_payload(kind: str = "nvidia-cdi") -> dict[str, Any]:
    """A Docker Engine `/info` body (a fresh copy each call).

    nvidia-cdi       Docker 29.7.2 with the nvidia runtime and three NVIDIA CDI devices
                     (nvidia.com/gpu=0, =GPU-0008bcf4-..., =all), as in the docker-info sample
    nvidia-runtime   the legacy nvidia runtime registered, DiscoveredDevices absent (Docker < 28.3)
    nvidia-cdi-empty nvidia runtime, DiscoveredDevices [] (CDI on, but no spec generated)
    cdi-only         NVIDIA CDI devices but no nvidia runtime
    no-nvidia        the real 29.6.1 /info sample: runc only, DiscoveredDevices absent
    """
    if kind == "no-nvidia":
        return _load("docker-info-no-nvidia.json")
    base = _load("docker-info-nvidia-cdi.json")
    if kind == "nvidia-cdi":
        return base
    if kind == "nvidia-runtime":
        base.pop("DiscoveredDevices")
        base.pop("CDISpecDirs")
        return base
    if kind == "nvidia-cdi-empty":
        base["DiscoveredDevices"] = []
        return base
    if kind == "cdi-only":
        base["Runtimes"].pop("nvidia")
        return base
    raise KeyError(f"unknown docker payload {kind!r}")


DOCKER_PAYLOADS = (
    "nvidia-cdi",
    "nvidia-runtime",
    "nvidia-cdi-empty",
    "cdi-only",
    "no-nvidia",
)


def copy_payload(payload: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(payload)
