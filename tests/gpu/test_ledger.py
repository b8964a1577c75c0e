"""Claims and the ledger's fit rules."""

from __future__ import annotations

import pytest

from gpufleet.gpu import (
    Claim,
    Device,
    DeviceTaken,
    DuplicateDevice,
    FitError,
    Info,
    Insufficient,
    Ledger,
    NoGPU,
    RuntimeMissing,
    UnknownDevice,
)

UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


def node(
    count: int = 8,
    runtime: bool = True,
    cdi: tuple[str, ...] = (),
    present: bool = True,
) -> Info:
    devices = tuple(
        Device(i, UUIDS[i], "NVIDIA H200", 143771, 0, 0) for i in range(count)
    )
    return Info(
        present=present,
        driver_version="570.195.03",
        devices=devices,
        runtime_installed=runtime,
        cdi_devices=cdi,
    )


@pytest.mark.parametrize(
    "claim, everything",
    [
        (Claim("a"), True),
        (Claim("a", count=0), True),
        (Claim("a", count=-1), True),
        (Claim("a", count=1), False),
        (Claim("a", count=0, device_ids=("0",)), False),
        (Claim("a", count=-3, device_ids=("0",)), False),
    ],
)
def test_it_knows_an_all_gpu_claim(claim, everything):
    assert claim.all is everything


def test_it_keeps_device_ids_as_a_tuple():
    claim = Claim("a", device_ids=["0", "1"])
    assert claim.device_ids == ("0", "1")
    assert hash(claim)


@pytest.mark.parametrize(
    "claims, reserved",
    [
        ([], 0),
        ([Claim("a", count=2)], 2),
        ([Claim("a", count=2), Claim("b", count=3)], 5),
        ([Claim("a", device_ids=("0", "1"))], 2),
        (
            [Claim("a", device_ids=("0",)), Claim("b", device_ids=(UUIDS[0].lower(),))],
            1,
        ),  # distinct devices
        ([Claim("a", device_ids=("0", " 0 "))], 1),
        ([Claim("a", device_ids=("0", "1"), count=5)], 2),  # pinned: count ignored
        ([Claim("a", device_ids=("0",)), Claim("b", count=3)], 4),
        ([Claim("a", count=6), Claim("b", count=6)], 8),  # never above total
        ([Claim("a", count=1), Claim("b")], 8),  # an all-GPU claim takes everything
        (
            [Claim("a", device_ids=("42",))],
            0,
        ),  # a GPU no longer on the node pins nothing
        ([Claim("a", count=-2, device_ids=())], 8),
    ],
)
def test_it_counts_reserved_and_free(claims, reserved):
    ledger = Ledger(node(), claims)
    assert ledger.total == 8
    assert ledger.reserved == reserved
    assert ledger.free == 8 - reserved


def test_it_has_nothing_without_a_gpu():
    ledger = Ledger(node(count=0, present=False), [Claim("a", count=2)])
    assert (ledger.total, ledger.reserved, ledger.free) == (0, 0, 0)


def test_it_lists_holders_sorted():
    ledger = Ledger(
        node(),
        [Claim("zeta", count=1), Claim("alpha", device_ids=("1",)), Claim("mid")],
    )
    assert ledger.holders == ["alpha", "mid", "zeta"]


def test_it_tells_who_holds_a_device():
    ledger = Ledger(
        node(), [Claim("train", device_ids=("0", UUIDS[3])), Claim("batch", count=2)]
    )
    assert ledger.holder_of(0) == "train"
    assert ledger.holder_of(3) == "train"
    assert ledger.holder_of(1) is None  # counts hold no particular GPU


def test_an_all_gpu_claim_holds_every_device():
    ledger = Ledger(node(), [Claim("everything")])
    assert [ledger.holder_of(i) for i in range(8)] == ["everything"] * 8


@pytest.mark.parametrize(
    "device_id, index",
    [
        ("3", 3),
        (" 3 ", 3),
        ("03", 3),
        (UUIDS[5], 5),
        (UUIDS[5].upper().replace("GPU", "gpu"), 5),
        (f"  {UUIDS[6]}\n", 6),
        ("8", None),
        ("GPU-nope", None),
        ("", None),
        ("-1", None),
    ],
)
def test_it_resolves_device_ids(device_id, index):
    device = Ledger(node(), []).resolve(device_id)
    assert (device.index if device else None) == index


FIT_CASES = [
    # (info, claims already there, new claim, expected error type, code)
    (node(count=0, present=False), [], Claim("a", count=1), NoGPU, "no_gpu"),
    (
        node(count=0, present=False, runtime=False),
        [],
        Claim("a"),
        NoGPU,
        "no_gpu",
    ),  # no GPU comes first
    (node(runtime=False), [], Claim("a", count=1), RuntimeMissing, "runtime_missing"),
    (
        node(runtime=False),
        [],
        Claim("a", device_ids=("99",)),
        RuntimeMissing,
        "runtime_missing",
    ),
    (node(), [Claim("b", count=1)], Claim("a"), Insufficient, "insufficient"),
    (
        node(),
        [Claim("b", device_ids=("0",))],
        Claim("a", count=-1),
        Insufficient,
        "insufficient",
    ),
    (
        node(),
        [Claim("b", count=1)],
        Claim("a", device_ids=("99", "0", "0")),
        UnknownDevice,
        "unknown_device",
    ),
    (
        node(),
        [],
        Claim("a", device_ids=("0", UUIDS[0])),
        DuplicateDevice,
        "duplicate_device",
    ),
    (
        node(),
        [],
        Claim("a", device_ids=("1", " 1")),
        DuplicateDevice,
        "duplicate_device",
    ),
    (
        node(),
        [Claim("b", device_ids=("2",))],
        Claim("a", device_ids=("0", "2", "2")),
        DuplicateDevice,
        "duplicate_device",
    ),
    (
        node(),
        [Claim("b", device_ids=("2",))],
        Claim("a", device_ids=("0", UUIDS[2])),
        DeviceTaken,
        "device_taken",
    ),
    (node(), [Claim("b")], Claim("a", device_ids=("0",)), DeviceTaken, "device_taken"),
    (node(), [Claim("b", count=6)], Claim("a", count=3), Insufficient, "insufficient"),
    (
        node(),
        [Claim("b", count=8)],
        Claim("a", device_ids=("0",)),
        Insufficient,
        "insufficient",
    ),
    (node(), [], Claim("a", count=9), Insufficient, "insufficient"),
]


@pytest.mark.parametrize("info, claims, claim, error_type, code", FIT_CASES)
def test_it_refuses_claims_that_do_not_fit(info, claims, claim, error_type, code):
    error = Ledger(info, claims).fit(claim)
    assert type(error) is error_type
    assert isinstance(error, FitError)
    assert error.code == code
    assert str(error)


@pytest.mark.parametrize(
    "info, claims, claim",
    [
        (node(), [], Claim("a")),
        (node(), [], Claim("a", count=8)),
        (node(), [Claim("b", count=6)], Claim("a", count=2)),
        (
            node(),
            [Claim("b", device_ids=("0",))],
            Claim("a", device_ids=("1", UUIDS[2])),
        ),
        (node(), [Claim("b", count=7)], Claim("a", device_ids=("7",))),
        (
            node(runtime=False, cdi=("nvidia.com/gpu=all",)),
            [],
            Claim("a", count=1),
        ),  # CDI is enough
        (node(), [Claim("b", device_ids=("0",), count=99)], Claim("a", count=7)),
    ],
)
def test_it_accepts_claims_that_fit(info, claims, claim):
    assert Ledger(info, claims).fit(claim) is None


def test_it_says_how_many_are_reserved_and_by_whom():
    ledger = Ledger(node(), [Claim("train", count=2), Claim("eval", device_ids=("5",))])
    error = ledger.fit(Claim("everything"))
    assert str(error) == "needs every GPU but 3 of 8 are reserved by eval, train"
    assert (error.need, error.free, error.total, error.holders) == (
        8,
        5,
        8,
        ("eval", "train"),
    )


def test_it_says_need_free_and_total():
    error = Ledger(node(), [Claim("b", count=6)]).fit(Claim("a", count=3))
    assert str(error) == "needs 3 GPUs but only 2 of 8 are free"
    assert (error.need, error.free, error.total) == (3, 2, 8)


def test_it_names_the_unknown_device():
    error = Ledger(node(), []).fit(Claim("a", device_ids=("1", "GPU-nope")))
    assert error.device_id == "GPU-nope"
    assert "GPU-nope" in str(error)


def test_it_clips_a_long_unknown_device_id_in_its_message():
    long_id = "GPU-" + "x" * 100_000
    error = Ledger(node(), []).fit(Claim("a", device_ids=(long_id,)))
    assert error.device_id == long_id  # kept whole for code; only the sentence is short
    assert len(str(error)) < 200
    assert str(error) == f"GPU {'GPU-' + 'x' * 76!r}… (100004 characters) is not present on the node"


def test_it_names_the_device_named_twice():
    error = Ledger(node(), []).fit(Claim("a", device_ids=("4", UUIDS[4].upper())))
    assert (error.device_id, error.index) == (UUIDS[4].upper(), 4)
    assert "GPU 4" in str(error)


def test_it_names_the_taken_device_and_its_holder():
    error = Ledger(node(), [Claim("train", device_ids=("3",))]).fit(
        Claim("a", device_ids=(UUIDS[3],))
    )
    assert (error.device_id, error.index, error.holder) == (UUIDS[3], 3, "train")
    assert str(error) == f"GPU 3 ('{UUIDS[3]}') is already reserved by train"


def test_editing_a_claim_validates_it_against_the_others_only():
    train = Claim("train", device_ids=("0", "1"))
    others = [Claim("eval", device_ids=("2",))]
    # Against all claims it would collide with itself; against the others it fits.
    assert isinstance(Ledger(node(), [train, *others]).fit(train), DeviceTaken)
    assert (
        Ledger(node(), others).fit(Claim("train", device_ids=("0", "1", "3"))) is None
    )
    assert isinstance(
        Ledger(node(), others).fit(Claim("train", device_ids=("0", "2"))), DeviceTaken
    )


def test_overlaps_names_each_claim_that_no_longer_fits_beside_the_older_ones():
    info = Info(present=True, driver_version="1", runtime_installed=True,
                devices=tuple(Device(i, f"GPU-{i}", "T4", 1, 0, 0) for i in range(2)))
    pinned, everything, two = Claim("pinned", device_ids=("1",)), Claim("everything", count=0), Claim("two", count=2)
    overlaps = Ledger(info, [pinned, everything, two]).overlaps()
    assert [(c.name, e.code) for c, e in overlaps] == [("everything", "insufficient"), ("two", "insufficient")]
    assert Ledger(info, [pinned, Claim("one", count=1)]).overlaps() == []
