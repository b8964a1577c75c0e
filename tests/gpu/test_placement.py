"""Placement: where N GPUs fit now, by the ledger's rules, on a fleet of mixed nodes."""

from __future__ import annotations

import pytest

from gpufleet.gpu import Candidate, Claim, Device, Info, Ledger, PlacementRequest, place
from gpufleet.gpu.placement import FAILING, LOW_VRAM, NO_MODEL, OFFLINE, STALE, TOO_FEW


def info(*gpus: tuple[str, int, int], runtime: bool = True) -> Info:
    """GPUs as (model, total MiB, used MiB)."""
    devices = tuple(
        Device(i, f"GPU-{i:04d}-{model.replace(' ', '')}", model, total, used, 0)
        for i, (model, total, used) in enumerate(gpus)
    )
    return Info(present=bool(devices), driver_version="570", devices=devices, runtime_installed=runtime)


H200 = ("NVIDIA H200", 143771, 0)
A100 = ("NVIDIA A100-SXM4-80GB", 81920, 0)
A100_BUSY = ("NVIDIA A100-SXM4-80GB", 81920, 71920)


def candidate(name: str, node: Info, *claims: Claim, **state) -> Candidate:
    return Candidate(name, Ledger(node, claims), **state)


def reasons(placement) -> dict[str, str]:
    return {r.name: r.code for r in placement.ruled_out}


def test_it_ranks_fewest_left_over_first_then_most_free_vram():
    fleet = [
        candidate("eight", info(*[H200] * 8)),
        candidate("two-a100", info(A100, A100)),
        candidate("two-h200", info(H200, H200)),
        candidate("four-half-taken", info(*[H200] * 4), Claim("train", count=2)),
    ]
    placement = place(PlacementRequest(count=2), fleet)
    # Exactly two free on three nodes: more free VRAM first, then by name.
    assert [f.name for f in placement.fits] == ["four-half-taken", "two-h200", "two-a100", "eight"]
    assert [f.left_over for f in placement.fits] == [0, 0, 0, 6]
    assert placement.ruled_out == []


def test_a_node_whose_free_gpus_are_too_few_says_how_many_are_free():
    fleet = [candidate("small", info(H200, H200, H200), Claim("a", device_ids=("0",)), Claim("b", count=1))]
    placement = place(PlacementRequest(count=2), fleet)
    assert placement.fits == []
    (ruled,) = placement.ruled_out
    assert ruled.code == TOO_FEW
    assert ruled.reason == "too few free GPUs (1 free of 3)"


def test_offline_failing_and_stale_nodes_are_ruled_out_before_their_ledger_is_asked():
    fleet = [
        candidate("off", info(H200), offline=True),
        candidate("bad", info(H200), failing=True),
        candidate("late", info(H200), stale=True),
        candidate("fine", info(H200)),
    ]
    placement = place(PlacementRequest(count=1), fleet)
    assert [f.name for f in placement.fits] == ["fine"]
    assert reasons(placement) == {"off": OFFLINE, "bad": FAILING, "late": STALE}
    assert placement.ruled_out_counts() == {OFFLINE: 1, FAILING: 1, STALE: 1}


def test_the_ledgers_own_reasons_rule_out_nodes_without_usable_gpus():
    fleet = [candidate("none", info()), candidate("no-runtime", info(H200, runtime=False))]
    placement = place(PlacementRequest(count=1), fleet)
    assert reasons(placement) == {"none": "no_gpu", "no-runtime": "runtime_missing"}


def test_a_model_matches_part_of_the_gpu_name_in_any_case():
    fleet = [candidate("h", info(H200, H200)), candidate("a", info(A100, A100)), candidate("mixed", info(H200, A100))]
    placement = place(PlacementRequest(count=2, model="a100"), fleet)
    assert [f.name for f in placement.fits] == ["a"]
    assert reasons(placement) == {"h": NO_MODEL, "mixed": TOO_FEW}
    assert {r.name: r.reason for r in placement.ruled_out}["mixed"] == "too few free GPUs (1 free of 2)"


def test_gpus_of_the_model_pinned_by_a_claim_do_not_count():
    node = info(A100, A100, H200)
    placement = place(PlacementRequest(count=2, model="A100"), [candidate("n", node, Claim("x", device_ids=("1",)))])
    assert reasons(placement) == {"n": TOO_FEW}


def test_counted_claims_use_up_gpus_of_the_model_too():
    # Two A100s unpinned, but a count of 2 on a 3-GPU node leaves only one free GPU.
    node = info(A100, A100, H200)
    placement = place(PlacementRequest(count=2, model="A100"), [candidate("n", node, Claim("x", count=2))])
    assert reasons(placement) == {"n": TOO_FEW}
    assert placement.ruled_out[0].reason == "too few free GPUs (1 free of 3)"


def test_min_free_vram_per_gpu():
    fleet = [candidate("roomy", info(A100, A100)), candidate("busy", info(A100_BUSY, A100_BUSY))]
    placement = place(PlacementRequest(count=1, min_free_vram_mib=20000), fleet)
    assert [f.name for f in placement.fits] == ["roomy"]
    assert reasons(placement) == {"busy": LOW_VRAM}


def test_a_gpu_without_memory_figures_does_not_meet_a_vram_minimum():
    fleet = [candidate("gh", info(("NVIDIA GH200", None, None)))]
    assert reasons(place(PlacementRequest(count=1, min_free_vram_mib=1), fleet)) == {"gh": LOW_VRAM}
    assert [f.name for f in place(PlacementRequest(count=1), fleet).fits] == ["gh"]


def test_the_fit_counts_the_free_vram_of_the_gpus_it_would_get():
    fleet = [candidate("n", info(A100_BUSY, A100, A100))]
    (fit,) = place(PlacementRequest(count=1, min_free_vram_mib=1000), fleet).fits
    assert fit.free_vram_mib == 81920
    assert fit.gpus == 1 and fit.left_over == 2


def test_all_gpus_of_a_node_needs_a_node_with_nothing_reserved():
    fleet = [
        candidate("empty-eight", info(*[H200] * 8)),
        candidate("empty-two", info(H200, H200)),
        candidate("one-taken", info(H200, H200), Claim("x", count=1)),
    ]
    placement = place(PlacementRequest(count=0), fleet)
    assert [(f.name, f.gpus, f.left_over) for f in placement.fits] == [("empty-eight", 8, 0), ("empty-two", 2, 0)]
    assert reasons(placement) == {"one-taken": TOO_FEW}
    assert placement.ruled_out[0].reason == "too few free GPUs (1 free of 2)"


def test_all_gpus_of_a_model_needs_every_gpu_of_that_model():
    fleet = [candidate("mixed", info(H200, A100)), candidate("a", info(A100, A100)), candidate("h", info(H200))]
    placement = place(PlacementRequest(count=0, model="a100"), fleet)
    assert [f.name for f in placement.fits] == ["a"]
    assert reasons(placement) == {"mixed": NO_MODEL, "h": NO_MODEL}


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_fit_is_a_claim_the_ledger_accepts(count):
    """The placement answer and the ledger never disagree: placing the claim on any
    fitting node fits, and every ruled-out node with GPUs refuses it."""
    fleet = [
        candidate("a", info(H200, H200, H200), Claim("x", device_ids=("1",))),
        candidate("b", info(A100, A100)),
        candidate("c", info(*[H200] * 4), Claim("y", count=3)),
        candidate("d", info(*[A100] * 4)),
    ]
    placement = place(PlacementRequest(count=count), fleet)
    by_name = {c.name: c for c in fleet}
    for fit in placement.fits:
        assert by_name[fit.name].ledger.fit(Claim("new", count=count)) is None
    for ruled in placement.ruled_out:
        assert by_name[ruled.name].ledger.fit(Claim("new", count=count)) is not None
    assert {f.name for f in placement.fits} | {r.name for r in placement.ruled_out} == set(by_name)


def test_every_reason_has_words():
    from gpufleet.gpu import PLACEMENT_REASONS

    fleet = [
        candidate("off", info(H200), offline=True),
        candidate("bad", info(H200), failing=True),
        candidate("late", info(H200), stale=True),
        candidate("none", info()),
        candidate("no-runtime", info(A100, runtime=False)),
        candidate("busy", info(A100_BUSY)),
        candidate("h", info(H200)),
        candidate("full", info(A100), Claim("x", count=1)),
    ]
    placement = place(PlacementRequest(count=1, model="a100", min_free_vram_mib=20000), fleet)
    assert set(placement.ruled_out_counts()) <= set(PLACEMENT_REASONS)
    assert len(placement.ruled_out_counts()) == 8
