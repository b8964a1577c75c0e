"""Processes on each GPU and the container each runs in (from its cgroup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.agent.adapters import proc_cgroup_reader
from gpufleet.gpu.processes import (
    MAX_INSPECTED,
    MAX_PROCESSES_PER_GPU,
    Container,
    GpuProcess,
    attached_idle,
    attribute,
    container_id_of,
    idle_candidates,
    parse_compute_apps,
    requested_gpus,
)

CID = "4f1d9c2b8e7a1d2c3b4a5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e"

COMPUTE_APPS = """\
GPU-6b3c0a1e-4f1d-9c2b-8e7a-1d2c3b4a5f60, 4412, python3, 30211
GPU-6b3c0a1e-4f1d-9c2b-8e7a-1d2c3b4a5f60, 5120, /usr/bin/vllm, [N/A]
GPU-6b3c1a1e-4f1d-9c2b-8e7a-1d2c3b4a5f61, 6001, Xorg, 4
"""


def test_it_reads_compute_apps_and_unknown_memory_as_none():
    rows = parse_compute_apps(COMPUTE_APPS)
    assert [(p.pid, p.name, p.used_mib) for p in rows] == [(4412, "python3", 30211), (5120, "/usr/bin/vllm", None),
                                                           (6001, "Xorg", 4)]


@pytest.mark.parametrize("text", ["No running processes found\n", "", "\n\n"])
def test_no_processes_means_none(text):
    assert parse_compute_apps(text) == []


@pytest.mark.parametrize(
    "cgroup",
    [
        f"12:devices:/docker/{CID}\n11:memory:/docker/{CID}\n",  # cgroup v1, Docker
        f"0::/system.slice/docker-{CID}.scope\n",  # cgroup v2, Docker with systemd
        f"0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-{CID}.scope\n",  # containerd
        f"0::/machine.slice/libpod-{CID}.scope/container\n",  # Podman
        f"0::/docker/{CID}/docker/0000000000000000000000000000000000000000000000000000000000000000\n",  # DinD
    ],
)
def test_it_finds_the_container_in_each_cgroup_format(cgroup):
    assert container_id_of(cgroup) == CID


@pytest.mark.parametrize("cgroup", ["0::/user.slice/user-1000.slice/session-3.scope\n", "0::/init.scope\n", ""])
def test_a_host_process_has_no_container(cgroup):
    assert container_id_of(cgroup) is None


def test_it_attributes_each_process_to_its_gpu_and_container(tmp_path: Path):
    (tmp_path / "4412").mkdir()
    (tmp_path / "4412" / "cgroup").write_text(f"0::/system.slice/docker-{CID}.scope\n")
    (tmp_path / "6001").mkdir()
    (tmp_path / "6001" / "cgroup").write_text("0::/system.slice/gdm.service\n")
    # 5120 has ended meanwhile: no /proc entry.
    containers = {CID: Container(CID, "trainer", "pytorch/pytorch:2.5.1-cuda12.4")}
    per_gpu = attribute(parse_compute_apps(COMPUTE_APPS), containers, proc_cgroup_reader(str(tmp_path)))
    first = per_gpu["GPU-6b3c0a1e-4f1d-9c2b-8e7a-1d2c3b4a5f60"]
    assert [p.to_dict() for p in first] == [
        {"pid": 4412, "name": "python3", "used_mib": 30211,
         "container": {"id": CID, "name": "trainer", "image": "pytorch/pytorch:2.5.1-cuda12.4", "claim": None}},
        {"pid": 5120, "name": "/usr/bin/vllm", "used_mib": None, "container": None},
    ]
    assert per_gpu["GPU-6b3c1a1e-4f1d-9c2b-8e7a-1d2c3b4a5f61"][0].container is None


def test_it_bounds_the_processes_per_gpu_biggest_first():
    many = [GpuProcess("GPU-a", pid, f"p{pid}", pid) for pid in range(1, 200)]
    kept = attribute(many, {}, lambda pid: None)["GPU-a"]
    assert len(kept) == MAX_PROCESSES_PER_GPU and kept[0].pid == 199


# --- containers attached to GPUs with no process yet -------------------------------


def _inspect(requests=None, env=()):
    return {"HostConfig": {"DeviceRequests": requests}, "Config": {"Env": list(env)}}


GPU_CAPS = [["gpu"]]


@pytest.mark.parametrize(
    "inspected, wanted",
    [
        (_inspect([{"Driver": "", "Count": -1, "Capabilities": GPU_CAPS}]), ("all",)),  # --gpus all
        (_inspect([{"Driver": "", "Count": 2, "Capabilities": GPU_CAPS}]), ("0", "1")),  # --gpus 2
        (_inspect([{"Driver": "", "Count": 0, "DeviceIDs": ["1", "GPU-abc"], "Capabilities": GPU_CAPS}]),
         ("1", "GPU-abc")),  # --gpus '"device=1,GPU-abc"'
        (_inspect([{"Driver": "nvidia", "Count": 1}]), ("0",)),
        (_inspect([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=0", "nvidia.com/gpu=MIG-x"]}]), ("0", "MIG-x")),
        (_inspect([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]), ("all",)),
        (_inspect([{"Driver": "cdi", "DeviceIDs": ["vendor.com/fpga=0"]}]), ()),  # not a GPU
        (_inspect(env=["NVIDIA_VISIBLE_DEVICES=0,2"]), ("0", "2")),  # the nvidia runtime's variable
        (_inspect(env=["NVIDIA_VISIBLE_DEVICES=all"]), ("all",)),
        (_inspect(env=["NVIDIA_VISIBLE_DEVICES=void"]), ()),
        (_inspect(env=["NVIDIA_VISIBLE_DEVICES=none"]), ()),
        (_inspect(env=["PATH=/usr/bin"]), ()),
        ({"HostConfig": "junk"}, ()),
        (None, ()),
    ],
)
def test_it_reads_which_gpus_a_container_asked_for(inspected, wanted):
    assert requested_gpus(inspected) == wanted


def test_an_idle_attached_container_is_listed_on_the_gpus_it_asked_for_only():
    uuids = ["GPU-0", "GPU-1", "GPU-2"]
    boxes = {c: Container(c, name, "img") for c, name in (("a" * 64, "notebook"), ("b" * 64, "all-of-it"))}
    inspected = {
        "a" * 64: _inspect([{"Driver": "", "DeviceIDs": ["1", "7"], "Capabilities": GPU_CAPS}]),  # 7: not here
        "b" * 64: _inspect(env=["NVIDIA_VISIBLE_DEVICES=all"]),
        "c" * 64: _inspect(env=["NVIDIA_VISIBLE_DEVICES=all"]),  # stopped since the list: not running
    }
    found = attached_idle(boxes, inspected, {"0": "GPU-0", "1": "GPU-1", "2": "GPU-2"}.get, uuids)
    assert {uuid: [c.name for c in cs] for uuid, cs in found.items()} == {
        "GPU-0": ["all-of-it"], "GPU-1": ["notebook", "all-of-it"], "GPU-2": ["all-of-it"]
    }


def test_only_containers_without_a_gpu_process_are_inspected_and_at_most_a_bound():
    busy_box = Container("a" * 64, "trainer", "img")
    others = {f"{i:064x}": Container(f"{i:064x}", f"c{i}", "img") for i in range(100)}
    containers = {busy_box.id: busy_box, **others}
    busy = {"GPU-0": [GpuProcess("GPU-0", 1, "python3", 10, busy_box)]}
    candidates = idle_candidates(containers, busy)
    assert busy_box.id not in candidates and len(candidates) == MAX_INSPECTED
