"""The ledger's count of GPUs busy beyond what the claims account for, and placement
not offering them: a GPU with a process or an attached container that no claim pins or
takes whole, less what the counted claims cover."""

from __future__ import annotations

import pytest

from gpufleet.gpu import Candidate, Claim, Device, Info, Ledger, PlacementRequest, place
from gpufleet.gpu.processes import Container, GpuProcess

BOX = Container("4f1d9c2b8e7a", "trainer", "pytorch/pytorch:2.5.1")


def gpus(count: int, running: tuple[int, ...] = (), attached: tuple[int, ...] = ()) -> Info:
    devices = []
    for i in range(count):
        uuid = f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd"
        devices.append(Device(i, uuid, "NVIDIA H200", 143771, 0, 0,
                              processes=(GpuProcess(uuid, 4412, "python3", 1024, BOX),) if i in running else (),
                              attached_idle=(BOX,) if i in attached else ()))
    return Info(present=True, driver_version="570", devices=tuple(devices), runtime_installed=True)


@pytest.mark.parametrize("claims, busy", [
    ((), 2),  # GPUs 0 and 1, no claim
    ((Claim("a", device_ids=("0",)),), 1),  # GPU 0 pinned: its work is the claim's
    ((Claim("a", count=1),), 1),  # a count covers one busy GPU, whichever
    ((Claim("a", count=3),), 0),
    ((Claim("a", count=0),), 0),  # every GPU held
    ((Claim("a", device_ids=("2",)), Claim("b", count=1)), 1),
])
def test_busy_gpus_beyond_the_claims(claims, busy):
    ledger = Ledger(gpus(4, running=(0,), attached=(1,)), claims)
    assert ledger.busy_unclaimed == busy
    # The same GPUs as "used but unclaimed" and "attached but unclaimed" judge them.
    assert (len(ledger.unclaimed_use()) > 0) == (busy > 0)


def test_placement_offers_only_the_gpus_neither_reserved_nor_busy():
    fleet = [Candidate("a", Ledger(gpus(4, running=(0,)), [Claim("x", device_ids=("3",))]))]
    assert [f.left_over for f in place(PlacementRequest(count=1), fleet).fits] == [1]
    assert [f.name for f in place(PlacementRequest(count=2), fleet).fits] == ["a"]
    (ruled,) = place(PlacementRequest(count=3), fleet).ruled_out
    assert ruled.reason == "too few free GPUs (2 free of 4, 1 busy with work no claim holds)"
    # Pinning some GPUs (a model asked): never the busy one.
    (fit,) = place(PlacementRequest(count=2, model="h200"), fleet).fits
    assert fit.device_ids == ("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "GPU-00000002-aaaa-bbbb-cccc-dddddddddddd")
