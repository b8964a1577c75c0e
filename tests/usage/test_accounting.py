"""Usage accounting of one snapshot (gpufleet/gpu/accounting.py), without Django: which
claim holds each GPU for accounting, and how a GPU's interval is shared among the
containers on it, with its energy."""

from __future__ import annotations

import pytest

from gpufleet.gpu import Claim, Device, IdleRule, Info, Ledger
from gpufleet.gpu.accounting import Key, Seconds, account, holders
from gpufleet.gpu.processes import Container, GpuProcess

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]
RULE = IdleRule(util_percent=5.0)
MODEL = "NVIDIA H100"


def box(name: str, image: str = "pytorch/pytorch:2.5.1", claim: str | None = None) -> Container:
    return Container(f"{name:0>12}", name, image, claim)


def on(index: int, container: Container | None = None, pid: int = 100) -> GpuProcess:
    return GpuProcess(UUIDS[index], pid, "python3", 1024, container)


def gpu(index: int, util: int | None = 0, procs=(), attached=(), power: float | None = None) -> Device:
    return Device(index, UUIDS[index], MODEL, 81559, 0, util, power_draw_w=power,
                  processes=tuple(procs), attached_idle=tuple(attached))


def node(*devices: Device) -> Info:
    return Info(present=True, driver_version="570.133.20", devices=tuple(devices), runtime_installed=True)


def quiet(count: int) -> Info:
    return node(*(gpu(i) for i in range(count)))


def held(info: Info, *claims: Claim) -> dict[int, int]:
    return holders(Ledger(info, claims), RULE)


# --- Who holds each GPU ---------------------------------------------------------------


def test_a_pinned_claim_holds_its_gpus_by_index_or_uuid_and_no_other():
    info = quiet(4)
    assert held(info, Claim("a", device_ids=("1", UUIDS[3].lower()))) == {1: 0, 3: 0}
    # Two pinned claims: each its own; a GPU no claim pins is held by nobody.
    assert held(info, Claim("a", device_ids=("0",)), Claim("b", device_ids=("2",))) == {0: 0, 2: 1}


def test_a_pinned_id_the_node_no_longer_has_holds_nothing():
    assert held(quiet(2), Claim("a", device_ids=("5",))) == {}


def test_an_all_gpu_claim_holds_every_gpu_whatever_else_is_claimed():
    info = quiet(4)
    assert held(info, Claim("all")) == {0: 0, 1: 0, 2: 0, 3: 0}
    assert held(info, Claim("pin", device_ids=("1",)), Claim("all"), Claim("n", count=1)) == {i: 1 for i in range(4)}


def test_a_count_claim_takes_its_labelled_busy_gpus_first_then_busy_then_idle():
    info = node(
        gpu(0),  # idle
        gpu(1, procs=[on(1)]),  # busy, no label
        gpu(2),  # idle
        gpu(3, procs=[on(3, box("t", claim="Train"))]),  # busy, labelled for "train" (any case)
    )
    assert held(info, Claim("train", count=1)) == {3: 0}
    assert held(info, Claim("train", count=2)) == {3: 0, 1: 0}
    assert held(info, Claim("train", count=3)) == {3: 0, 1: 0, 0: 0}


def test_busy_by_utilization_alone_counts_as_busy_for_a_count_claim():
    info = node(gpu(0, util=0), gpu(1, util=4), gpu(2, util=5))
    assert held(info, Claim("n", count=1)) == {2: 0}


def test_count_claims_share_unlabelled_work_only_beyond_what_the_others_want():
    info = node(
        gpu(0),
        gpu(1, procs=[on(1)]),
        gpu(2, procs=[on(2, box("b", claim="newer"))]),
        gpu(3, procs=[on(3)]),
    )
    # "newer" takes the GPU labelled for it first. Of the two unlabelled busy GPUs, one is
    # more than "newer" still wants, so it is "older"'s; the other could be either's: the
    # idle GPU goes out first (oldest claim first), then that one.
    assert held(info, Claim("older", count=2), Claim("newer", count=2)) == {2: 1, 1: 0, 0: 0, 3: 1}


def test_count_claims_are_capped_by_the_gpus_no_pinned_claim_holds():
    info = node(gpu(0, procs=[on(0)]), gpu(1), gpu(2))
    found = held(info, Claim("pin", device_ids=("0",)), Claim("old", count=2), Claim("new", count=2))
    assert found == {0: 0, 1: 1, 2: 1}  # the pinned busy GPU stays the pinned claim's; "new" gets none


def test_a_count_of_zero_with_pinned_ids_is_a_pinned_claim_not_an_all_gpu_one():
    assert held(quiet(3), Claim("p", count=0, device_ids=("2",))) == {2: 0}
    assert held(quiet(3), Claim("p", count=2, device_ids=("2",))) == {2: 0}  # a pinned claim's count is ignored


# --- How each GPU's time is shared ----------------------------------------------------


def lines(info: Info, *claims: Claim, seconds: float = 300.0) -> dict[Key, Seconds]:
    return account(Ledger(info, claims), seconds, RULE)


def test_a_gpu_s_time_is_shared_evenly_among_the_containers_with_a_process_on_it():
    a, b = box("a", "img/a:1", claim="x"), box("b", "img/b:1")
    info = node(gpu(0, util=90, procs=[on(0, a, 1), on(0, a, 2), on(0, b, 3)], power=300.0))
    found = lines(info)
    # Two processes of one container are one sharer: two containers, half each.
    assert found == {
        Key(None, MODEL, "img/a:1", "x"): Seconds(150.0, 150.0, 150.0, 300.0 * 150 / 3600),
        Key(None, MODEL, "img/b:1", ""): Seconds(150.0, 150.0, 150.0, 300.0 * 150 / 3600),
    }


def test_a_process_outside_any_container_counts_under_no_image():
    info = node(gpu(0, util=90, procs=[on(0, None, 1), on(0, None, 2), on(0, box("a", "img/a:1"), 3)]))
    found = lines(info, seconds=600.0)
    assert {k.image: s.seen for k, s in found.items()} == {"": 300.0, "img/a:1": 300.0}
    assert all(s.used == s.seen for s in found.values())


def test_two_containers_of_one_image_add_into_one_line():
    info = node(gpu(0, util=90, procs=[on(0, box("a", "img:1"), 1), on(0, box("b", "img:1"), 2)]))
    assert lines(info) == {Key(None, MODEL, "img:1", ""): Seconds(300.0, 300.0)}


def test_an_idle_gpu_is_shared_among_its_attached_containers_and_counts_as_not_used():
    a, b = box("a", "img/a:1", claim="held"), box("b", "img/b:1")
    info = node(gpu(0, util=0, attached=[a, b, a]))  # a container listed twice is one sharer
    found = lines(info, Claim("held", device_ids=("0",)))
    assert found == {
        Key(0, MODEL, "img/a:1", "held"): Seconds(150.0, 0.0),
        Key(0, MODEL, "img/b:1", ""): Seconds(150.0, 0.0),
    }


def test_attached_containers_do_not_share_a_gpu_busy_without_a_process():
    # Utilization with no process found is work nobody can be named for: no image.
    info = node(gpu(0, util=80, attached=[box("a", "img/a:1")]))
    assert lines(info) == {Key(None, MODEL, "", ""): Seconds(300.0, 300.0)}


def test_a_quiet_gpu_with_nothing_on_it_is_one_line_under_no_image():
    assert lines(quiet(1), Claim("all")) == {Key(0, MODEL, "", ""): Seconds(300.0, 0.0)}


def test_unknown_power_adds_nothing_to_power_known_or_energy():
    info = node(gpu(0, util=50, power=None), gpu(1, util=50, power=0.0), gpu(2, util=50, power=400.0))
    found = lines(info, Claim("p", device_ids=("0",)), Claim("q", device_ids=("1", "2")), seconds=900.0)
    assert found[Key(0, MODEL)] == Seconds(900.0, 900.0, 0.0, 0.0)
    # A reading of 0 W is a reading: its time counts as known, drawing nothing.
    assert found[Key(1, MODEL)] == Seconds(1800.0, 1800.0, 1800.0, 100.0)  # 400 W for a quarter hour


def test_utilization_unknown_and_no_process_is_not_used():
    assert lines(node(gpu(0, util=None))) == {Key(None, MODEL): Seconds(300.0, 0.0)}


def test_each_gpu_is_held_by_its_claim_in_the_lines():
    info = node(gpu(0, util=50), gpu(1), gpu(2, util=50))
    found = lines(info, Claim("pin", device_ids=("1",)), Claim("n", count=1))
    assert found == {
        Key(1, MODEL): Seconds(300.0, 300.0),  # the count takes a busy GPU (0, the first)
        Key(0, MODEL): Seconds(300.0, 0.0),
        Key(None, MODEL): Seconds(300.0, 300.0),  # GPU 2: busy, no claim holds it
    }


@pytest.mark.parametrize("seconds", [1.0, 300.0, 7.5])
def test_the_lines_of_a_snapshot_add_up_to_its_gpu_count_times_the_interval(seconds):
    a, b, c = box("a", "img/a:1", claim="n"), box("b", "img/b:2"), box("c", "img/c:3", claim="pin")
    info = node(
        gpu(0, util=95, procs=[on(0, a, 1), on(0, b, 2), on(0, None, 3)], power=250.0),
        gpu(1, util=0, attached=[a, b, c], power=60.0),
        gpu(2, util=0, power=None),
        gpu(3, util=30, attached=[c], power=None),
        gpu(4, util=0, procs=[on(4, c, 9)], power=120.0),
        gpu(5, util=None),
        gpu(6, util=70, procs=[on(6, None, 4)], power=500.0),
    )
    claims = (Claim("pin", device_ids=("4", "5")), Claim("n", count=3), Claim("other", count=3))
    found = lines(info, *claims, seconds=seconds)
    assert sum(s.seen for s in found.values()) == pytest.approx(7 * seconds)
    busy = [0, 3, 4, 6]  # a process, or utilization at or above the rule's
    assert sum(s.used for s in found.values()) == pytest.approx(len(busy) * seconds)
    assert sum(s.power_known for s in found.values()) == pytest.approx(4 * seconds)
    assert sum(s.energy_wh for s in found.values()) == pytest.approx((250 + 60 + 120 + 500) * seconds / 3600)
    # Every GPU is held: two pinned, three for "n" (the busy ones first), two for "other".
    by_claim: dict[int | None, float] = {}
    for key, share in found.items():
        by_claim[key.claim] = by_claim.get(key.claim, 0.0) + share.seen
    assert by_claim == pytest.approx({0: 2 * seconds, 1: 3 * seconds, 2: 2 * seconds})
