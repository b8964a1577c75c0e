"""Claims against real use: GPUs busy beyond what the claims hold, and containers
labelled with a claim running on GPUs that claim does not hold."""

from __future__ import annotations

import pytest

from gpufleet.gpu import Claim, Device, Info, Ledger, Status, claim_use_findings
from gpufleet.gpu.processes import Container, GpuProcess, containers_from_payload

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def container(name: str, claim: str | None = None) -> Container:
    return Container(f"{abs(hash(name)):064x}"[:64], name, "pytorch/pytorch:2.5.1", claim)


def node(busy: dict[int, list[GpuProcess]], idle: dict[int, list[Container]] | None = None) -> Info:
    idle = idle or {}
    devices = tuple(
        Device(i, UUIDS[i], "NVIDIA H100", 81559, 0, 0, processes=tuple(busy.get(i, ())),
               attached_idle=tuple(idle.get(i, ())))
        for i in range(4)
    )
    return Info(present=True, driver_version="570.133.20", devices=devices, runtime_installed=True)


def on(index: int, name: str = "python3", pid: int = 100, box: Container | None = None) -> GpuProcess:
    return GpuProcess(UUIDS[index], pid, name, 1024, box)


def findings(info: Info, *claims: Claim) -> dict[str, object]:
    return {f.code: f for f in claim_use_findings(Ledger(info, claims))}


def test_work_on_gpus_that_claims_hold_or_a_count_covers_gives_nothing():
    info = node({0: [on(0)], 1: [on(1)], 2: [on(2)]})
    assert findings(info, Claim("train", device_ids=(UUIDS[0],)), Claim("eval", count=2)) == {}
    assert findings(info, Claim("everything")) == {}  # an "all GPUs" claim holds every GPU
    assert findings(node({}),) == {}  # idle and unclaimed is just free


def test_busy_gpus_beyond_the_claims_are_used_but_unclaimed():
    info = node({0: [on(0)], 2: [on(2, box=container("trainer"))], 3: [on(3, "Xorg", 7)]})
    found = findings(info, Claim("eval", count=2))  # three busy GPUs, a count of two
    unclaimed = found["use-unclaimed"]
    assert unclaimed.status == Status.WARN
    assert unclaimed.message.startswith("3 GPUs in use that no claim holds: GPU 0 (python3 (pid 100)); "
                                        "GPU 2 (container trainer); GPU 3 (Xorg (pid 7))")
    # A pinned claim's GPU is never unclaimed use, whatever runs there.
    pinned = findings(info, Claim("train", device_ids=("0", "2")))
    assert "GPU 3" in pinned["use-unclaimed"].message and "GPU 0" not in pinned["use-unclaimed"].message


@pytest.mark.parametrize(
    "claims, label, why",
    [
        ((Claim("train", device_ids=("1",)),), "train", "claim 'train' holds other GPUs"),
        ((Claim("train", count=1), Claim("infer", device_ids=("0",))), "train", "GPU 0 is held by 'infer'"),
        ((Claim("infer", device_ids=("0",)),), "nightly", "no claim named 'nightly' on this node"),
    ],
)
def test_a_container_labelled_with_a_claim_off_its_gpus_is_in_the_wrong_place(claims, label, why):
    info = node({0: [on(0, box=container("job-7", label))]})
    misplaced = findings(info, *claims)["use-misplaced"]
    assert misplaced.status == Status.WARN
    assert f"container job-7 on GPU 0: {why}" in misplaced.message


def test_a_labelled_container_on_its_claims_gpus_is_in_place_whatever_the_case():
    info = node({0: [on(0, box=container("job-7", "TRAIN"))], 1: [on(1, box=container("job-8", "batch"))]})
    assert findings(info, Claim("train", device_ids=("0",)), Claim("batch", count=1)) == {}


def test_the_claim_label_is_read_from_the_engine_list_one_line_and_clipped():
    payload = [
        {"Id": "a" * 64, "Names": ["/job-7"], "Image": "img", "Labels": {"gpufleet.claim": "train\u202e\n"}},
        {"Id": "b" * 64, "Names": ["/job-8"], "Image": "img", "Labels": {"gpufleet.claim": "x" * 300}},
        {"Id": "c" * 64, "Names": ["/job-9"], "Image": "img", "Labels": None},
    ]
    found = containers_from_payload(payload)
    assert found["a" * 64].claim == "train"
    assert found["b" * 64].claim == "x" * 200
    assert found["c" * 64].claim is None


def test_a_container_attached_idle_is_use_too():
    info = node({}, idle={1: [container("notebook", "nightly")]})
    found = findings(info)
    assert "GPU 1 (container notebook, idle)" in found["use-unclaimed"].message
    assert "container notebook on GPU 1: no claim named 'nightly' on this node" in found["use-misplaced"].message
    assert findings(info, Claim("nightly", device_ids=("1",))) == {}
