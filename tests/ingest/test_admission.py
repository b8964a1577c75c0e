"""The per-node admission cap of the ingest (gpufleet/ingest/admission.py): at most
`cap` messages of one node within any collect interval, per node, with bounded memory.
The clock is the caller's `now`, so these tests move it by hand."""

from __future__ import annotations

import time

import pytest

from gpufleet.ingest import admission as admission_module
from gpufleet.ingest.admission import Admission, SharedAdmission
from tests.integration.conftest import own_redis  # noqa: F401  (a redis-server of the test's own)


def test_it_admits_up_to_the_cap_then_refuses_within_the_interval():
    admission = Admission(cap=4, interval_s=30)
    assert [admission.admit("alpha", 100.0 + i) for i in range(6)] == [True] * 4 + [False] * 2


def test_a_flooding_node_does_not_take_another_nodes_share():
    admission = Admission(cap=4, interval_s=30)
    assert sum(admission.admit("bravo", 100.0 + i / 1000) for i in range(100_000 // 100)) == 4
    assert admission.admit("alpha", 100.5)


def test_the_window_slides_so_a_burst_at_an_edge_gets_no_double_share():
    admission = Admission(cap=2, interval_s=30)
    assert admission.admit("alpha", 29.0) and admission.admit("alpha", 29.5)
    # A fixed window starting at 30 s would let two more in here.
    assert not admission.admit("alpha", 31.0)
    assert not admission.admit("alpha", 58.9)
    assert admission.admit("alpha", 59.0)  # the first has left the window
    assert admission.admit("alpha", 59.5)
    assert not admission.admit("alpha", 59.6)


def test_refusals_do_not_push_the_node_back():
    admission = Admission(cap=1, interval_s=30)
    assert admission.admit("alpha", 0.0)
    for t in range(1, 30):
        assert not admission.admit("alpha", float(t))
    assert admission.admit("alpha", 30.0)


def test_it_forgets_nodes_quiet_for_an_interval():
    admission = Admission(cap=4, interval_s=30)
    for i in range(1000):
        admission.admit(f"node-{i}", 0.0)
    assert len(admission) == 1000
    admission.admit("alpha", 31.0)
    assert len(admission) == 1


def test_it_takes_its_figures_from_the_settings(settings):
    settings.GPUFLEET_INGEST_CAP_PER_INTERVAL = 3
    settings.GPUFLEET_COLLECT_INTERVAL = 10.0
    admission = Admission.from_settings()
    assert (admission.cap, admission.interval_s) == (3, 10.0)


@pytest.mark.parametrize(("cap", "interval"), [(0, 30), (4, 0)])
def test_it_refuses_a_cap_that_admits_nothing(cap, interval):
    with pytest.raises(ValueError, match="cap >= 1"):
        Admission(cap, interval)


def test_a_grant_is_the_first_entries_up_to_the_cap_and_unused_grants_go_back():
    admission = Admission(cap=4, interval_s=30)
    assert admission.grant({"alpha": 3, "bravo": 6}, 0.0) == {"alpha": 3, "bravo": 4}
    admission.give_back({"alpha": 2, "bravo": 0})  # two of alpha's were left for a later batch
    assert admission.grant({"alpha": 6, "bravo": 1}, 1.0) == {"alpha": 3, "bravo": 0}


def test_consumers_sharing_redis_share_each_nodes_cap(own_redis):  # noqa: F811
    client = own_redis.client()
    one, two = (SharedAdmission(client, "test:admitted:", cap=4, interval_s=10_000_000) for _ in range(2))
    assert one.grant({"alpha": 3}) == {"alpha": 3}
    assert two.grant({"alpha": 3, "bravo": 2}) == {"alpha": 1, "bravo": 2}
    assert one.grant({"alpha": 1}) == {"alpha": 0}
    two.give_back({"alpha": 1, "bravo": 0})  # one of its grants was left for a later batch
    assert one.grant({"alpha": 5, "bravo": 5}) == {"alpha": 1, "bravo": 2}
    assert one.grant({}) == {}
    # A node's grants are forgotten an interval after its last one.
    assert 0 < client.pttl("test:admitted:alpha") <= 10_000_000_000


def test_a_shared_cap_slides_with_the_interval(own_redis):  # noqa: F811
    admission = SharedAdmission(own_redis.client(), "test:admitted:", cap=2, interval_s=0.3)
    assert admission.grant({"alpha": 1}) == {"alpha": 1}
    time.sleep(0.2)
    assert admission.grant({"alpha": 5}) == {"alpha": 1}
    time.sleep(0.15)  # the first has left the window, the second not yet
    assert admission.grant({"alpha": 5}) == {"alpha": 1}
    time.sleep(0.35)
    assert admission.grant({"alpha": 5}) == {"alpha": 2}


def test_consumers_sharing_redis_share_the_entries_seen_until_the_window_passes(own_redis, monkeypatch):  # noqa: F811
    monkeypatch.setattr(admission_module, "SEEN_INTERVALS", 1)
    one, two = (SharedAdmission(own_redis.client(), "test:admitted:", cap=4, interval_s=0.3) for _ in range(2))
    one.remember([("alpha", "sig-1"), ("bravo", "sig-1")])
    assert two.seen([("alpha", "sig-1"), ("alpha", "sig-2"), ("bravo", "sig-1")]) == {("alpha", "sig-1"), ("bravo", "sig-1")}
    time.sleep(0.35)
    assert two.seen([("alpha", "sig-1")]) == set()
    local = Admission(cap=4, interval_s=30)
    local.remember([("alpha", "sig-1")], 0.0)
    assert local.seen([("alpha", "sig-1"), ("alpha", "sig-2")], 29.0) == {("alpha", "sig-1")}
    assert local.seen([("alpha", "sig-1")], 31.0) == set()
