"""The ledger over windows of time: a claim holds its GPUs over [starts_at, ends_at)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.gpu import Claim, DeviceTaken, Insufficient, Ledger
from tests.gpu.test_ledger import node

TUESDAY = datetime(2026, 12, 8, 9, 0, tzinfo=UTC)


def at(hours: float) -> datetime:
    return TUESDAY + timedelta(hours=hours)


def booking(name: str = "train-llm", start: float = 0, end: float | None = 56, **kwargs) -> Claim:
    """By default Tue 8 Dec 09:00 to Thu 10 Dec 17:00."""
    return Claim(name, starts_at=at(start), ends_at=None if end is None else at(end), **kwargs)


def test_a_claim_is_in_force_from_its_start_until_before_its_end():
    claim = booking(start=0, end=2)
    assert [claim.in_force(at(h)) for h in (-0.5, 0, 1.9, 2, 3)] == [False, True, True, False, False]
    assert Claim("open", starts_at=at(0)).in_force(at(10_000))
    assert Claim("always").in_force(None) and Claim("always").in_force(at(0))
    assert claim.overlaps(booking(start=1.5, end=5)) and not claim.overlaps(booking(start=2, end=5))
    assert not booking(start=1, end=1).overlaps(claim), "an empty window meets nothing"


def test_a_gpu_held_by_a_booking_is_refused_over_it_naming_it_and_its_window():
    ledger = Ledger(node(4), [booking(device_ids=("3",))])
    error = ledger.fit(booking("eval", start=10, end=12, device_ids=("3",)))
    assert isinstance(error, DeviceTaken) and error.code == "device_taken"
    assert str(error) == "GPU 3 ('3') is already reserved by train-llm from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC"
    assert error.ends_by is None  # in its way from its very start: no earlier end helps


@pytest.mark.parametrize("start, end", [(-5, 0), (56, 60), (56, None), (-10, -1)])
def test_the_same_gpu_is_free_outside_the_booking_windows_being_half_open(start, end):
    ledger = Ledger(node(4), [booking(device_ids=("3",))])
    assert ledger.fit(booking("eval", start=start, end=end, device_ids=("3",))) is None


def test_an_open_ended_claim_running_into_a_later_booking_is_offered_to_end_before_it():
    ledger = Ledger(node(4), [booking(device_ids=("3",))])
    error = ledger.fit(Claim("notebook", device_ids=("3",), starts_at=at(-20)))
    assert isinstance(error, DeviceTaken)
    assert error.ends_by == at(0)
    assert str(error).endswith("reserved by train-llm from Tue 8 Dec 09:00 to Thu 10 Dec 17:00 UTC;"
                               " it fits if it ends by Tue 8 Dec 09:00 UTC")
    # Taking the offer fits.
    assert ledger.fit(Claim("notebook", device_ids=("3",), starts_at=at(-20), ends_at=error.ends_by)) is None


def test_counts_must_fit_at_every_instant_not_in_sum():
    # Three bookings of 2 GPUs on a 4-GPU node, one after another: never more than 2 at once.
    ledger = Ledger(node(4), [booking("a", 0, 10, count=2), booking("b", 10, 20, count=2), booking("c", 20, 30, count=2)])
    assert ledger.fit(booking("d", 0, 30, count=2)) is None
    assert isinstance(ledger.fit(booking("d", 0, 30, count=3)), Insufficient)
    # Two that overlap only partly: the peak is where both are in force.
    overlapping = Ledger(node(4), [booking("a", 0, 10, count=2), booking("b", 5, 15, count=1)])
    error = overlapping.fit(booking("d", 0, 20, count=2))
    assert isinstance(error, Insufficient) and (error.need, error.free) == (2, 1)
    assert str(error) == ("needs 2 GPUs but only 1 of 4 is free from Tue 8 Dec 14:00 UTC beside"
                          " a (from Tue 8 Dec 09:00 to Tue 8 Dec 19:00 UTC), b (from Tue 8 Dec 14:00 to Wed 9 Dec 00:00 UTC);"
                          " it fits if it ends by Tue 8 Dec 14:00 UTC")
    assert overlapping.fit(booking("d", 10, 20, count=3)) is None


def test_a_pinned_claim_and_counts_share_the_node_at_each_instant():
    ledger = Ledger(node(2), [booking("a", 0, 10, count=1), booking("b", 10, 20, device_ids=("0",))])
    assert ledger.fit(booking("d", 0, 20, device_ids=("1",))) is None
    assert isinstance(ledger.fit(booking("d", 0, 20, device_ids=("0",))), DeviceTaken)


def test_a_whole_node_claim_waits_for_every_booking_in_its_window():
    ledger = Ledger(node(4), [booking("a", 10, 20, count=1)])
    assert ledger.fit(booking("all", 0, 10)) is None
    assert ledger.fit(booking("all", 20, None)) is None
    error = ledger.fit(booking("all", 0, 15))
    assert isinstance(error, Insufficient) and error.holders == ("a",) and error.ends_by == at(10)
    assert str(error).startswith("needs every GPU but 1 of 4 is reserved from Tue 8 Dec 19:00 UTC by a (from")


def test_claims_without_windows_read_as_before():
    ledger = Ledger(node(8), [Claim("train", count=3), Claim("eval", device_ids=("2",))])
    assert str(ledger.fit(Claim("x", count=5))) == "needs 5 GPUs but only 4 of 8 are free"
    assert str(ledger.fit(Claim("x"))) == "needs every GPU but 4 of 8 are reserved by eval, train"


GPUS = 3
HOURS = st.integers(0, 12)


@st.composite
def windowed_claims(draw) -> Claim:
    start = draw(HOURS)
    length = draw(st.one_of(st.none(), st.integers(1, 6)))
    kind = draw(st.sampled_from(["count", "all", "pinned"]))
    window = {"starts_at": at(start), "ends_at": None if length is None else at(start + length)}
    name = f"c{draw(st.integers(0, 10_000))}"
    if kind == "pinned":
        ids = draw(st.lists(st.integers(0, GPUS - 1).map(str), min_size=1, max_size=2, unique=True))
        return Claim(name, device_ids=tuple(ids), **window)
    return Claim(name, count=0 if kind == "all" else draw(st.integers(1, GPUS)), **window)


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None)
@given(st.lists(windowed_claims(), max_size=12))
def test_no_accepted_set_of_windows_holds_a_gpu_twice_at_any_instant(candidates):
    info = node(GPUS)
    accepted: list[Claim] = []
    for claim in candidates:
        if Ledger(info, accepted).fit(claim) is None:
            accepted.append(claim)
    # Every half hour over the whole span covers each window's start, end and inside.
    for step in range(0, 2 * 20):
        moment = at(step / 2)
        held = Ledger(info, [c for c in accepted if c.in_force(moment)])
        pinned = [int(i) for c in held.claims for i in c.device_ids]
        assert len(pinned) == len(set(pinned)), f"a GPU pinned twice at {moment}"
        if any(c.all for c in held.claims):
            assert len(held.claims) == 1, f"a whole-node claim beside others at {moment}"
        counted = sum(c.count for c in held.claims if not c.device_ids and c.count > 0)
        assert len(pinned) + counted <= GPUS, f"more GPUs held than the node has at {moment}"
