"""When GPUs are free: a node's ledger over time, for the calendar, the free counts and
"find a slot"; every slot offered is one the ledger takes."""

from __future__ import annotations

from datetime import timedelta
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.gpu import Claim, Device, Info, Ledger
from gpufleet.gpu.availability import (
    FREE,
    FULL,
    HELD,
    SlotRequest,
    count_lanes,
    earliest_slot,
    find_slots,
    fleet_free_by_model,
    lanes,
)
from gpufleet.gpu.placement import Candidate
from tests.gpu.test_ledger import UUIDS, node
from tests.gpu.test_ledger_windows import at, booking

HOUR = timedelta(hours=1)


def mixed(models=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB")) -> Info:
    memory = {"NVIDIA H100 80GB HBM3": 81559, "NVIDIA A100-SXM4-40GB": 40960}
    devices = tuple(Device(i, UUIDS[i], name, memory[name], 0, 0) for i, name in enumerate(models))
    return Info(present=True, driver_version="570", devices=devices, runtime_installed=True)


def states(lane) -> list[tuple[int, int, str, str | None]]:
    return [(r.first, r.slots, r.state, r.claim.name if r.claim else None) for r in lane.runs]


def test_it_lays_each_gpu_out_by_the_hour_with_who_holds_it():
    ledger = Ledger(node(2), [booking("train", 2, 5, device_ids=("1",)), booking("all", 8, 9)])
    found = lanes(ledger, at(0), HOUR, 10)
    assert states(found[0]) == [(0, 8, FREE, None), (8, 1, HELD, "all"), (9, 1, FREE, None)]
    assert states(found[1]) == [(0, 2, FREE, None), (2, 3, HELD, "train"), (5, 3, FREE, None),
                                (8, 1, HELD, "all"), (9, 1, FREE, None)]
    assert found[1].runs[1].starts_at == at(2) and found[1].runs[1].ends_at == at(5)


def test_an_hour_a_claim_touches_is_its_whole():
    ledger = Ledger(node(1), [booking("short", 1.25, 1.5, device_ids=("0",))])
    assert states(lanes(ledger, at(0), HOUR, 3)[0]) == [(0, 1, FREE, None), (1, 1, HELD, "short"), (2, 1, FREE, None)]


def test_counts_fill_the_gpus_no_claim_holds_without_holding_any():
    ledger = Ledger(node(2), [booking("pinned", 0, 4, device_ids=("0",)), booking("some", 2, 3, count=1)])
    found = lanes(ledger, at(0), HOUR, 4)
    assert states(found[1]) == [(0, 2, FREE, None), (2, 1, FULL, None), (3, 1, FREE, None)]
    [(claim, runs)] = count_lanes(ledger, at(0), HOUR, 4)
    assert claim.name == "some"
    assert [(r.first, r.slots, r.state) for r in runs] == [(0, 2, ""), (2, 1, HELD), (3, 1, "")]
    assert count_lanes(ledger, at(3), HOUR, 1) == []


def test_free_counts_per_model_are_the_fewest_free_in_each_bucket():
    ledger = Ledger(mixed(), [booking("h", 1, 2.5, device_ids=("0",)), booking("n", 5, 6, count=3)])
    edges = [at(h) for h in range(7)]
    counts = fleet_free_by_model([Candidate("n", ledger)], edges)
    assert counts == {
        "NVIDIA A100-SXM4-40GB": [2, 2, 2, 2, 2, 1],
        "NVIDIA H100 80GB HBM3": [2, 1, 1, 2, 2, 1],
    }


def test_the_fleet_sums_the_open_nodes_only():
    open_node = Candidate("a", Ledger(mixed(), [booking("h", 0, 1, device_ids=("0",))]))
    other = Candidate("b", Ledger(node(2), []))
    closed = Candidate("c", Ledger(node(4), []), maintenance=True)
    counts = fleet_free_by_model([open_node, other, closed], [at(0), at(1), at(2)])
    assert counts == {"NVIDIA A100-SXM4-40GB": [2, 2], "NVIDIA H100 80GB HBM3": [1, 2], "NVIDIA H200": [2, 2]}


def wanted(count=1, hours=2.0, after=0.0, **kwargs) -> SlotRequest:
    return SlotRequest(after=at(after), duration=timedelta(hours=hours), count=count, **kwargs)


def test_a_free_node_is_free_at_once():
    slot = earliest_slot("a", Ledger(node(4), []), wanted(2))
    assert (slot.starts_at, slot.ends_at, [d.index for d in slot.gpus], slot.left_over) == (at(0), at(2), [0, 1], 2)


def test_the_earliest_window_starts_when_a_claim_in_the_way_ends():
    ledger = Ledger(node(2), [booking("a", -1, 3, device_ids=("0",)), booking("b", 1, 5, device_ids=("1",))])
    assert earliest_slot("n", ledger, wanted(1, hours=2)).starts_at == at(3)
    assert earliest_slot("n", ledger, wanted(2, hours=1)).starts_at == at(5)
    # Short enough to pass before the second claim starts.
    assert earliest_slot("n", ledger, wanted(1, hours=1)).gpus[0].index == 1


def test_counts_are_fitted_at_every_instant():
    ledger = Ledger(node(4), [booking("a", 0, 4, count=2), booking("b", 2, 6, count=1)])
    slot = earliest_slot("n", ledger, wanted(2, hours=3))
    assert slot.starts_at == at(4)
    assert earliest_slot("n", ledger, wanted(1, hours=8)).starts_at == at(0)


def test_model_and_memory_choose_the_gpus():
    ledger = Ledger(mixed(), [booking("h", 0, 10, device_ids=("0",))])
    a100 = earliest_slot("n", ledger, wanted(2, model="a100"))
    assert [d.index for d in a100.gpus] == [2, 3] and a100.starts_at == at(0)
    roomy = earliest_slot("n", ledger, wanted(2, min_vram_mib=80000))
    assert [d.index for d in roomy.gpus] == [0, 1] and roomy.starts_at == at(10)
    assert earliest_slot("n", ledger, wanted(3, model="h100")) is None
    assert earliest_slot("n", ledger, wanted(1, model="b200")) is None


def test_an_open_ended_claim_in_the_way_leaves_no_slot():
    ledger = Ledger(node(1), [Claim("forever", starts_at=at(5))])
    assert earliest_slot("n", ledger, wanted(1, hours=2)).starts_at == at(0)
    assert earliest_slot("n", ledger, wanted(1, hours=6)) is None


def test_no_slot_on_a_node_that_cannot_attach_gpus():
    assert earliest_slot("n", Ledger(node(2, runtime=False), []), wanted(1)) is None


def test_slots_are_best_first_and_closed_nodes_are_left_out():
    busy = Candidate("busy", Ledger(node(2), [booking("x", 0, 3, count=2)]))
    roomy = Candidate("roomy", Ledger(node(8), []))
    snug = Candidate("snug", Ledger(node(2), []))
    away = Candidate("away", Ledger(node(8), []), offline=True)
    found = find_slots(wanted(2), [busy, roomy, snug, away], limit=10)
    assert [(s.node, s.starts_at, s.left_over) for s in found] == [("snug", at(0), 0), ("roomy", at(0), 6), ("busy", at(3), 0)]
    assert [s.node for s in find_slots(wanted(2), [busy, roomy, snug], limit=1)] == ["snug"]


windows = st.lists(
    st.tuples(st.integers(0, 20), st.integers(1, 8), st.integers(0, 3), st.booleans()), max_size=6)


@settings(max_examples=150, deadline=None)
@given(windows, st.integers(1, 3), st.integers(1, 6), st.integers(0, 10))
def test_a_slot_is_one_the_ledger_takes_and_none_earlier_is(claims, count, hours, after):
    made = [
        Claim(f"c{i}", starts_at=at(s), ends_at=at(s + length), **({"device_ids": (str(n),)} if pinned else {"count": n or 1}))
        for i, (s, length, n, pinned) in enumerate(claims)
    ]
    ledger = Ledger(node(4), made)
    slot = earliest_slot("n", ledger, wanted(count, hours=hours, after=after))
    assert slot is not None  # every claim ends, so some window comes
    probe = Claim("p", device_ids=slot.device_ids, starts_at=slot.starts_at, ends_at=slot.ends_at)
    assert ledger.fit(probe) is None
    # No whole hour earlier fits any N GPUs (the claims all start and end on the hour).
    for start in range(after, int((slot.starts_at - at(0)) / HOUR)):
        for gpus in combinations(UUIDS[:4], count):
            assert ledger.fit(Claim("p", device_ids=gpus, starts_at=at(start), ends_at=at(start + hours))) is not None


def test_a_claim_on_gpus_the_node_no_longer_has_holds_nothing():
    ledger = Ledger(node(2), [booking("gone", 0, 5, device_ids=("GPU-no-longer-there",)), booking("one", 0, 5, device_ids=("1",))])
    assert [states(lane) for lane in lanes(ledger, at(0), HOUR, 5)] == [[(0, 5, FREE, None)], [(0, 5, HELD, "one")]]
    assert fleet_free_by_model([Candidate("n", ledger)], [at(0), at(5)]) == {"NVIDIA H200": [1]}
    assert earliest_slot("n", ledger, wanted(1)).gpus[0].index == 0


# --- the fast paths give the straightforward answers --------------------------------

MODELS = ("NVIDIA H200", "NVIDIA A100-SXM4-40GB")


def straightforward_free(candidates, edges) -> dict[str, list[int]]:
    """The fleet's free GPUs per model and bucket by the definition, instant by instant:
    at each instant a claim starts or ends in a bucket (and at its start), a GPU is free
    when no claim in force holds it and the node's free count is at least one."""
    total: dict[str, list[int]] = {}
    for candidate in candidates:
        if candidate.closed() is not None:
            continue
        ledger = candidate.ledger
        models = sorted({d.name for d in ledger.info.devices})
        for model in models:
            total.setdefault(model, [0] * (len(edges) - 1))
        for i, (a, b) in enumerate(zip(edges, edges[1:], strict=False)):
            moments = [a, *(t for c in ledger.claims for t in (c.starts_at, c.ends_at) if t is not None and a < t < b)]
            for model in models:
                total[model][i] += min(free_at(ledger, moment, model) for moment in moments)
    return dict(sorted(total.items()))


def free_at(ledger: Ledger, moment, model: str) -> int:
    held = Ledger(ledger.info, [c for c in ledger.claims if c.in_force(moment)])
    if held.free < 1:
        return 0
    return min(held.free, sum(1 for d in ledger.info.devices if d.name == model and held.holding(d.index) is None))


def straightforward_slots(request: SlotRequest, candidates, limit: int):
    """Every open node's earliest slot, sorted best first."""
    slots = [earliest_slot(c.name, c.ledger, request) for c in candidates if c.closed() is None]
    return sorted((s for s in slots if s is not None), key=lambda s: (s.starts_at, s.left_over, s.node))[:limit]


def fleet_info(gpus: list[int], present: bool, runtime: bool) -> Info:
    devices = tuple(Device(i, UUIDS[i], MODELS[m], 143771 if m == 0 else 40960, 0, 0) for i, m in enumerate(gpus))
    return Info(present=present, driver_version="570", devices=devices, runtime_installed=runtime)


def claim_of(i: int, start: int | None, length: int | None, kind: int, n: int) -> Claim:
    """A claim over quarter hours, some unbounded: pinning a GPU by index, by UUID or one
    the node lacks, a count, or every GPU."""
    window = {"starts_at": None if start is None else at(start / 4),
              "ends_at": None if length is None else at(((start or 0) + length) / 4)}
    kinds = ({"device_ids": (str(n),)}, {"device_ids": (UUIDS[n], str((n + 1) % 4))}, {"device_ids": ("GPU-gone",)},
             {"count": n + 1}, {"count": 0})
    return Claim(f"c{i}", **kinds[kind], **window)


fleets = st.lists(st.tuples(
    st.lists(st.integers(0, 1), max_size=4),  # each GPU's model
    st.lists(st.tuples(st.one_of(st.none(), st.integers(-8, 60)), st.one_of(st.none(), st.integers(0, 24)),
                       st.integers(0, 4), st.integers(0, 3)), max_size=4),
    st.booleans(), st.booleans(), st.booleans()), max_size=6)


def candidates_of(fleet) -> list[Candidate]:
    return [Candidate(f"n{k}", Ledger(fleet_info(gpus, present, runtime),
                                      [claim_of(i, *c) for i, c in enumerate(claims)]), offline=closed)
            for k, (gpus, claims, present, runtime, closed) in enumerate(fleet)]


@settings(max_examples=200, deadline=None)
@given(fleets, st.integers(0, 8), st.sampled_from([1, 3, 12]))
def test_the_fleets_free_gpus_are_those_of_the_definition(fleet, first, hours):
    candidates = candidates_of(fleet)
    edges = [at(first + h * hours) for h in range(5)]
    expected = straightforward_free(candidates, edges)
    assert fleet_free_by_model(candidates, edges) == expected
    # Nodes no claim meets may be counted apart, by model, as the loader counts them in SQL.
    span = Claim("shown", starts_at=edges[0], ends_at=edges[-1])
    unbooked: dict[str, int] = {}
    booked = []
    for candidate in candidates:
        if any(c.overlaps(span) for c in candidate.ledger.claims):
            booked.append(candidate)
        elif candidate.closed() is None:
            for d in candidate.ledger.info.devices:
                unbooked[d.name] = unbooked.get(d.name, 0) + (1 if candidate.ledger.info.present else 0)
    assert fleet_free_by_model(booked, edges, unbooked) == expected
