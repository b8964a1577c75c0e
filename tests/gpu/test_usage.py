"""Claims against real use: GPUs busy beyond what the claims hold, and containers
labelled with a claim running on GPUs that claim does not hold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.gpu import Claim, Device, IdleRule, Info, Ledger, Status, claim_use_findings
from gpufleet.gpu.accounting import holders
from gpufleet.gpu.accounting import idle_claims as idle_claims_of
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


def test_a_container_attached_idle_is_attached_idle_not_use():
    info = node({}, idle={1: [container("notebook", "nightly")]})
    found = findings(info)
    assert "use-unclaimed" not in found
    attached = found["attached-unclaimed"]
    assert attached.name == "Attached but unclaimed" and attached.status == Status.WARN
    assert attached.message == "1 GPU with a container attached, idle, that no claim holds: GPU 1 (container notebook)"
    assert "container notebook on GPU 1: no claim named 'nightly' on this node" in found["use-misplaced"].message
    assert findings(info, Claim("nightly", device_ids=("1",))) == {}
    # A count covers an attached GPU as it covers a busy one.
    assert "attached-unclaimed" not in findings(info, Claim("eval", count=1))


def test_a_gpu_at_work_with_an_attached_container_is_in_use():
    """No process seen, but utilization at the idle rule's threshold: that is work (a
    process in another PID namespace, say), whatever container is attached."""
    at_work = Device(1, UUIDS[1], "NVIDIA H100", 81559, 0, 60, attached_idle=(container("notebook"),))
    idle = Device(2, UUIDS[2], "NVIDIA H100", 81559, 0, 0, attached_idle=(container("shell"),))
    busy = Device(3, UUIDS[3], "NVIDIA H100", 81559, 0, 0, processes=(on(3),), attached_idle=(container("debug"),))
    info = Info(present=True, driver_version="570.133.20", devices=(at_work, idle, busy), runtime_installed=True)
    found = findings(info)
    assert found["use-unclaimed"].message == ("2 GPUs in use that no claim holds: GPU 1 (container notebook, attached,"
                                              " idle); GPU 3 (python3 (pid 100), container debug, attached, idle)")
    assert found["attached-unclaimed"].message == ("1 GPU with a container attached, idle, that no claim holds:"
                                                   " GPU 2 (container shell)")


# --- Claimed but idle ----------------------------------------------------------


T0 = datetime(2026, 12, 1, tzinfo=UTC)
HOURS = 24


def idle_claims(info: Info, idle: set[int], *claims: Claim, started: datetime = T0):
    """The idle claims when the GPUs in `idle` did no work since T0 and the others worked
    a moment ago, the claims made at `started`, judged a day after T0."""
    quiet_since = {d.index: T0 if d.index in idle else T0 + timedelta(hours=HOURS) for d in info.devices}
    now = T0 + timedelta(hours=HOURS)
    found = idle_claims_of(Ledger(info, claims), quiet_since, [started] * len(claims), now - timedelta(hours=HOURS),
                           IdleRule(hours=HOURS))
    return [(claim.name, gpus) for claim, gpus, _ in found]


def test_a_pinned_claim_is_idle_only_when_every_gpu_it_pins_is():
    info = node({})
    pinned = Claim("train", device_ids=("0", UUIDS[1]))
    assert idle_claims(info, {0, 1, 3}, pinned) == [("train", (0, 1))]
    assert idle_claims(info, {0, 3}, pinned) == []  # GPU 1 worked


def test_an_all_gpus_claim_is_judged_by_all_and_a_count_by_the_gpus_no_claim_pins():
    info = node({})
    assert idle_claims(info, {0, 1, 2}, Claim("everything")) == []
    assert idle_claims(info, {0, 1, 2, 3}, Claim("everything")) == [("everything", (0, 1, 2, 3))]
    pinned, counted = Claim("train", device_ids=("0",)), Claim("eval", count=2)
    # GPU 0 worked for "train"; the count is judged by GPUs 1-3 only.
    assert idle_claims(info, {1, 2, 3}, pinned, counted) == [("eval", (1, 2, 3))]
    assert idle_claims(info, {0, 1, 3}, pinned, counted) == [("train", (0,))]  # GPU 2 may be eval's work


def test_a_claim_whose_gpus_are_gone_is_not_idle():
    assert idle_claims(node({}), {0, 1, 2, 3}, Claim("old", device_ids=("GPU-gone",))) == []


def test_a_claim_is_idle_from_its_start_when_its_gpus_were_idle_before_it():
    info, claim = node({}), Claim("train", count=2)
    # GPUs idle for a day, a claim made 40 s ago: not idle yet, and not "since" before it existed.
    assert idle_claims(info, {0, 1, 2, 3}, claim, started=T0 + timedelta(hours=HOURS, seconds=-40)) == []
    made = T0 + timedelta(hours=1)
    quiet_since = dict.fromkeys(range(4), T0)
    cutoff = made + timedelta(hours=HOURS)
    [(_, _, since)] = idle_claims_of(Ledger(info, [claim]), quiet_since, [made], cutoff, IdleRule(hours=HOURS))
    assert since == made  # the later of its start and its GPUs' last work


def test_a_count_claim_is_not_credited_with_the_other_claims_labelled_work():
    box = container("trainer", "train")
    # "train" (a count of 2) runs on three GPUs; "quiet" runs nothing of its own.
    info = node({0: [on(0, box=box)], 1: [on(1, box=box)], 2: [on(2, box=box)]})
    claims = (Claim("quiet", count=1), Claim("train", count=2))
    assert idle_claims(info, {3}, *claims) == [("quiet", (3,))]
    assert holders(Ledger(info, claims), IdleRule()) == {0: 1, 1: 1, 3: 0}


def test_a_count_claim_is_credited_unlabelled_work_only_beyond_what_the_others_want():
    # Two GPUs busy with work no label names: the older "quiet" may not take it, as the
    # newer "train" (a count of 2) explains it all.
    info = node({0: [on(0)], 1: [on(1)]})
    claims = (Claim("quiet", count=2), Claim("train", count=2))
    assert idle_claims(info, {2, 3}, *claims) == [("quiet", (2, 3))]
    assert holders(Ledger(info, claims), IdleRule()) == {2: 0, 3: 0, 0: 1, 1: 1}
    # Three busy: one is more than "train" wants, so it may be (and is) quiet's.
    busier = node({0: [on(0)], 1: [on(1)], 2: [on(2)]})
    assert idle_claims(busier, {3}, *claims) == []
    assert holders(Ledger(busier, claims), IdleRule()) == {0: 0, 3: 0, 1: 1, 2: 1}


def test_the_idle_finding_names_each_claim_its_gpus_and_the_rule():
    info = node({}, idle={1: [container("notebook", "train")]})
    claims = (Claim("train", device_ids=("1",)), Claim("eval", count=1))
    ledger = Ledger(info, claims)
    quiet_since = dict.fromkeys(range(4), T0)
    idle = idle_claims_of(ledger, quiet_since, [T0, T0], T0 + timedelta(hours=24), IdleRule(5, 24))
    found = {f.code: f for f in claim_use_findings(ledger, idle, IdleRule(5, 24))}
    idle = found["claim-idle"]
    assert idle.status == Status.WARN and idle.name == "Claimed but idle"
    assert idle.message == ("2 claims with no process and under 5% utilization on any of its GPUs for 24 h:"
                            " 'train' (GPU 1); 'eval' (GPUs 0, 2, 3)")
    assert "use-unclaimed" not in found  # the attached container is train's, and the claim holds GPU 1
    assert claim_use_findings(ledger, [], IdleRule()) == []


def test_work_is_a_process_or_utilization_at_the_threshold_never_an_attached_container():
    rule = IdleRule(util_percent=5)
    quiet = node({}, idle={0: [container("notebook")]}).devices[0]
    assert not rule.busy(quiet)
    assert not rule.busy(Device(0, UUIDS[0], "NVIDIA H100", 81559, 0, 4))
    assert rule.busy(Device(0, UUIDS[0], "NVIDIA H100", 81559, 0, 5))
    assert rule.busy(node({0: [on(0)]}).devices[0])
    assert not rule.busy(Device(0, UUIDS[0], "NVIDIA H100", 81559, 0, None))  # unknown is no evidence of work


def test_a_booking_with_no_work_since_its_start_is_idle_after_the_no_show_hours():
    """The no-show rule: a booking (made before its start) none of whose GPUs did work
    since it started is idle `no_show_hours` after its start, long before the idle rule's."""
    info, booking = node({}), Claim("lab", count=2)
    start = T0 + timedelta(hours=1)
    quiet_since = dict.fromkeys(range(4), T0)
    rule = IdleRule(hours=HOURS, no_show_hours=2)

    def found(booked: bool, quiet=quiet_since, at=start + timedelta(hours=2)):
        idle = idle_claims_of(Ledger(info, [booking]), quiet, [start], at - timedelta(hours=HOURS), rule,
                              booked=[booked], at=at)
        return [(claim.name, since) for claim, _, since in idle]

    assert found(True) == [("lab", start)]
    assert found(True, at=start + timedelta(hours=2, seconds=-1)) == []
    assert found(False) == []  # a claim made at its start waits for the idle rule's hours
    worked = {**quiet_since, 0: start + timedelta(minutes=30)}  # GPU 0 worked after the start
    assert found(True, quiet=worked) == []


def test_the_idle_finding_names_the_no_show_rule_when_there_is_one():
    info = node({})
    ledger = Ledger(info, (Claim("lab", count=1),))
    idle = idle_claims_of(ledger, dict.fromkeys(range(4), T0), [T0], T0, IdleRule(5, 24, no_show_hours=2))
    found = {f.code: f for f in claim_use_findings(ledger, idle, IdleRule(5, 24, no_show_hours=2))}
    assert found["claim-idle"].message == ("1 claim with no process and under 5% utilization on any of its GPUs for"
                                           " 24 h (a booking: 2 h from its start): 'lab' (GPUs 0, 1, 2, 3)")
