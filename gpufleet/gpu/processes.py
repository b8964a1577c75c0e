"""Who is on each GPU: the compute processes nvidia-smi lists, and the container
each one runs in, found from its cgroup.

A process's cgroup comes from `cgroup_of(pid)`, which the agent reads from /proc
(gpufleet/agent/adapters.py) and tests answer themselves.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

COMPUTE_APPS_ARGV = [
    "nvidia-smi",
    "--query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory",
    "--format=csv,noheader,nounits",
]
# Bounds on what one snapshot carries, so a fork bomb on a GPU cannot bloat it.
MAX_PROCESSES_PER_GPU = 64
MAX_PROCESS_NAME = 200
# A workload says which claim it belongs to with this container label
# (`docker run --label gpufleet.claim=train-llm ...`), so the site can tell when it
# runs on GPUs its claim does not hold.
CLAIM_LABEL = "gpufleet.claim"

# The container ID in a cgroup path, as Docker, containerd and Podman write it
# (cgroup v1 "/docker/<id>", v2 "docker-<id>.scope", "cri-containerd-<id>.scope",
# "libpod-<id>.scope"; also the nested "/docker/<id>/..." of Docker in Docker).
_CONTAINER_IN_CGROUP = re.compile(
    r"(?:/docker/|/docker-|docker-|cri-containerd-|/libpod-|libpod-|/containerd/)([0-9a-f]{64})(?:\.scope)?(?:/|$)"
)


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    image: str
    claim: str | None = None  # its CLAIM_LABEL, when it has one

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "image": self.image, "claim": self.claim}


@dataclass(frozen=True)
class GpuProcess:
    """A process on a GPU: its PID, name, VRAM (None when nvidia-smi cannot say,
    e.g. on Windows or without permission) and container (None outside any)."""

    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None
    container: Container | None = None

    def to_dict(self) -> dict:
        return {
            "pid": self.pid,
            "name": self.name,
            "used_mib": self.used_mib,
            "container": self.container.to_dict() if self.container else None,
        }


def containers_from_payload(payload: object) -> dict[str, Container]:
    """Running containers by ID from the Engine API's `GET /containers/json`;
    entries it cannot read are skipped."""
    found: dict[str, Container] = {}
    for entry in payload if isinstance(payload, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("Id"), str):
            continue
        names = entry.get("Names") if isinstance(entry.get("Names"), list) else []
        name = str(names[0]).lstrip("/") if names else entry["Id"][:12]
        labels = entry.get("Labels") if isinstance(entry.get("Labels"), dict) else {}
        claim = _one_line(labels.get(CLAIM_LABEL))
        found[entry["Id"]] = Container(entry["Id"], name[:200], str(entry.get("Image") or "")[:200], claim)
    return found


# Containers the agent inspects per collection for GPUs they asked for (the list
# call does not say); the rest wait for the next collection.
MAX_INSPECTED = 32
ALL_GPUS = "all"


def requested_gpus(inspected: object) -> tuple[str, ...]:
    """The GPUs a container asked for, from `GET /containers/<id>/json`: `("all",)`,
    or device ids as Docker passes them (indexes, UUIDs, MIG UUIDs); () for none.
    It asks through HostConfig.DeviceRequests (`--gpus`, or CDI names such as
    `nvidia.com/gpu=0` with `--device`) or the NVIDIA_VISIBLE_DEVICES variable."""
    if not isinstance(inspected, dict):
        return ()
    host = inspected.get("HostConfig") if isinstance(inspected.get("HostConfig"), dict) else {}
    wanted: list[str] = []
    for request in host.get("DeviceRequests") or ():
        if not isinstance(request, dict):
            continue
        ids = [str(i) for i in request.get("DeviceIDs") or () if isinstance(i, (str, int))]
        if request.get("Driver") == "cdi":
            wanted += [i.split("=", 1)[1] for i in ids if i.startswith("nvidia.com/gpu=")]
        elif request.get("Driver") == "nvidia" or _asks_for_gpu(request.get("Capabilities")):
            count = request.get("Count")
            if ids:
                wanted += ids
            elif count == -1:
                wanted.append(ALL_GPUS)
            elif isinstance(count, int) and count > 0:
                wanted += [str(i) for i in range(count)]  # `--gpus 2` gets the first two
    config = inspected.get("Config") if isinstance(inspected.get("Config"), dict) else {}
    for variable in config.get("Env") or ():
        if isinstance(variable, str) and variable.startswith("NVIDIA_VISIBLE_DEVICES="):
            value = variable.split("=", 1)[1].strip()
            if value not in ("", "none", "void"):
                wanted += [v.strip() for v in value.split(",") if v.strip()]
    return (ALL_GPUS,) if ALL_GPUS in wanted else tuple(dict.fromkeys(wanted))


def _asks_for_gpu(capabilities: object) -> bool:
    return isinstance(capabilities, list) and any(isinstance(c, list) and "gpu" in c for c in capabilities)


def idle_candidates(containers: Mapping[str, Container], busy: Mapping[str, list[GpuProcess]]) -> list[str]:
    """IDs of the running containers with no process on any GPU: the ones worth
    asking whether they hold GPUs anyway. At most MAX_INSPECTED."""
    with_work = {p.container.id for found in busy.values() for p in found if p.container is not None}
    return [cid for cid in containers if cid not in with_work][:MAX_INSPECTED]


def _one_line(value: object) -> str | None:
    """A label value as the snapshot may carry it: one line, clipped; None when
    missing or blank."""
    if not isinstance(value, str):
        return None
    text = "".join(ch for ch in value if ch.isprintable()).strip()[:200]
    return text or None


def parse_compute_apps(text: str) -> list[GpuProcess]:
    """Rows of COMPUTE_APPS_ARGV's output; "No running processes found", blank
    lines and rows that cannot be read are skipped (they name no process)."""
    found = []
    for line in text.splitlines():
        if "," not in line:
            continue
        values = [v.strip() for v in next(csv.reader([line.strip()], skipinitialspace=True))]
        if len(values) != 4 or not values[1].isdigit():
            continue
        gpu_uuid, pid, name, used = values
        number = used.split(" ", 1)[0]  # "30211" or, with units, "30211 MiB"
        memory = int(number) if number.isdigit() else None  # "[N/A]" and the like: unknown
        found.append(GpuProcess(gpu_uuid, int(pid), name[:MAX_PROCESS_NAME], memory))
    return found


def container_id_of(cgroup_text: str) -> str | None:
    """The container ID in a /proc/<pid>/cgroup file, or None for a host process."""
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if match := _CONTAINER_IN_CGROUP.search(path):
            return match.group(1)
    return None


def attached_idle(
    containers: Mapping[str, Container],
    inspected: Mapping[str, object],
    resolve: Callable[[str], str | None],
    gpu_uuids: list[str],
) -> dict[str, list[Container]]:
    """The containers that asked for GPUs and run nothing on them yet ("attached,
    idle"), per GPU UUID. `inspected` maps container IDs to their inspect answers;
    `resolve` turns a device id into a GPU UUID (None for one the host lacks)."""
    per_gpu: dict[str, list[Container]] = {}
    for cid, answer in inspected.items():
        container = containers.get(cid)
        wanted = requested_gpus(answer)
        if container is None or not wanted:
            continue
        uuids = gpu_uuids if wanted == (ALL_GPUS,) else [u for u in map(resolve, wanted) if u is not None]
        for uuid in dict.fromkeys(uuids):
            found = per_gpu.setdefault(uuid, [])
            if len(found) < MAX_PROCESSES_PER_GPU:
                found.append(container)
    return per_gpu


def attribute(
    processes: list[GpuProcess],
    containers: Mapping[str, Container],
    cgroup_of: Callable[[int], str | None],
) -> dict[str, list[GpuProcess]]:
    """Processes per GPU UUID, each with its container when its cgroup names one
    that Docker lists; at most MAX_PROCESSES_PER_GPU per GPU, biggest VRAM first."""
    per_gpu: dict[str, list[GpuProcess]] = {}
    for process in processes:
        cgroup = cgroup_of(process.pid)
        container_id = container_id_of(cgroup) if cgroup else None
        container = containers.get(container_id) if container_id else None
        if container_id and container is None:
            container = Container(container_id, container_id[:12], "")  # not (yet) listed by Docker
        per_gpu.setdefault(process.gpu_uuid, []).append(
            GpuProcess(process.gpu_uuid, process.pid, process.name, process.used_mib, container)
        )
    return {
        uuid: sorted(found, key=lambda p: -(p.used_mib or 0))[:MAX_PROCESSES_PER_GPU]
        for uuid, found in per_gpu.items()
    }
