"""Recorded host outputs under tests/fakes/data/: the one set of recordings and its index,
read by both fake hosts (the executables in bin/ through FakeHost, the in-memory runner
in memory.py) and by the domain tests, always through `data_path` / `recording`.

- `smi-*`: rows of gpufleet's own query of the seven reference fields (docs/agent.md),
  `nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,driver_version
  --format=csv,noheader,nounits`. The 8x H200 and 8x A40 memory and utilization figures are
  from real hosts; the A40 file keeps the units (`46068 MiB`, `76 %`) that some hosts print
  despite `nounits`. Each file is described in SMI_OUTPUTS below.
- `smi-error-exitN.txt`: what nvidia-smi prints when it fails, with its exit code in the name.
- `ctk-*.txt`: `nvidia-ctk --version`; the first line is the version.
- `cdi-nvidia.yaml`: a spec written by `nvidia-ctk cdi generate` (T4, lists shortened).
- `docker-info-*.json`: Docker Engine `/info` bodies, see `docker_payload`.
- `health/`: the full health query of several GPU families (a header row names the fields
  that driver knows, see smi_query.py; `.exitN` in a name is nvidia-smi's exit code), kernel
  logs in each dmesg prefix format (and a refused read), an `nvidia-smi -L` of a MIG host;
  `smi-2x-a100-r525.csv` is a driver before R535 (clock-event reasons as clocks_throttle_reasons).
- `drivers/`: real `--help-query-gpu` listings of three driver generations and `nvidia-smi nvlink
  -s` / `-e` of an 8-GPU A100 host; drivers/README.md says where each came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
BIN_DIR = Path(__file__).resolve().parent / "bin"

#: short name -> recorded nvidia-smi output (FakeHost.smi takes either)
SMI_OUTPUTS: dict[str, str] = {
    "h200": "smi-8x-h200.csv",  # 8x NVIDIA H200, driver 570.195.03; GPU 0 at 90.4 % VRAM, GPU 7 idle
    "a40": "smi-8x-a40-with-units.csv",  # 8x NVIDIA A40, driver 550.127.05, values with units
    "mixed": "smi-2x-mixed.csv",  # RTX 4080 SUPER + RTX 3090, driver 560.35.03
    "util-na": "smi-2x-k80-util-placeholders.csv",  # 2x K80: "[Not Supported]" and "[N/A]" utilization
    "memory-na": "smi-1x-gh200-memory-na.csv",  # 1x GH200 (unified memory): memory "[N/A]"
    "warnings": "smi-2x-warnings-around-rows.txt",  # the mixed pair between "WARNING: ..." lines
    "garbage-row": "smi-garbage-row.csv",  # the mixed pair, row 2 memory.total "lots"
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


def data_path(name: str) -> Path:
    """Path of a recorded file: a short name from SMI_OUTPUTS/CTK_OUTPUTS or a path
    under data/ ("smi-8x-h200.csv", "health/kernel-iso.txt")."""
    file = SMI_OUTPUTS.get(name) or CTK_OUTPUTS.get(name) or name
    path = DATA_DIR / file
    if not path.is_file():
        raise KeyError(f"no recorded output {name!r} in {DATA_DIR}")
    return path


def recording(name: str) -> str:
    """The text of a recorded file (a name as `data_path` takes it)."""
    return data_path(name).read_text()


#: the UUIDs of the recorded H200 host, GPU 0 first
H200_UUIDS: tuple[str, ...] = tuple(row.split(", ")[1] for row in recording("h200").splitlines())


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
