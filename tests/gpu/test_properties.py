"""Properties: parse_smi fails only with SmiParseError; accepted claims never overbook."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.gpu import Claim, Device, Info, Ledger, SmiParseError, parse_smi

pytestmark = pytest.mark.fuzz

FAST = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# Values nvidia-smi prints, plus near misses, mixed with anything at all.
FIELD = st.one_of(
    st.sampled_from(
        [
            "0",
            "7",
            "143771",
            "143771 MiB",
            "100 %",
            "[N/A]",
            "[Not Supported]",
            "N/A",
            "GPU-a44622e3",
            "NVIDIA H200",
            "570.195.03",
            "",
            " ",
            "-1",
            "1.5",
            "99999999999999999999",
        ]
    ),
    st.text(max_size=12),
)


def _expect_only_parse_errors(text: str) -> None:
    try:
        driver, devices = parse_smi(text)
    except SmiParseError as exc:
        assert str(exc).startswith("row ")
        return
    assert isinstance(driver, str)
    assert all(isinstance(d, Device) for d in devices)
    assert len({d.index for d in devices}) == len(devices)


@FAST
@given(st.text(max_size=300))
def test_parse_smi_raises_only_smi_parse_error_for_any_text(text):
    _expect_only_parse_errors(text)


@FAST
@given(st.lists(st.lists(FIELD, min_size=7, max_size=7), max_size=5))
def test_parse_smi_raises_only_smi_parse_error_for_any_7_field_rows(rows):
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    _expect_only_parse_errors(out.getvalue())


@FAST
@given(st.lists(st.lists(st.text(max_size=8), min_size=7, max_size=7), max_size=4))
def test_parse_smi_raises_only_smi_parse_error_for_rows_joined_naively(rows):
    _expect_only_parse_errors("\n".join(", ".join(row) for row in rows))


GPUS = 6
UUIDS = [f"GPU-{i:04d}-feed" for i in range(GPUS)]
INFO = Info(
    present=True,
    driver_version="570.195.03",
    devices=tuple(Device(i, UUIDS[i], "NVIDIA A40", 46068, 0, 0) for i in range(GPUS)),
    runtime_installed=True,
)
DEVICE_ID = st.one_of(
    st.integers(0, GPUS + 1).map(str),  # includes ids that are not on the node
    st.sampled_from(UUIDS).map(lambda u: f" {u.upper()} "),
    st.sampled_from(UUIDS),
)
CLAIM = st.builds(
    Claim,
    name=st.sampled_from(["train", "eval", "batch", "notebook"]),
    count=st.integers(-1, GPUS + 1),
    device_ids=st.one_of(st.just(()), st.lists(DEVICE_ID, max_size=3).map(tuple)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(CLAIM, max_size=10))
def test_claims_accepted_one_by_one_never_overbook(candidates):
    accepted: list[Claim] = []
    for claim in candidates:
        if Ledger(INFO, accepted).fit(claim) is None:
            accepted.append(claim)
    ledger = Ledger(INFO, accepted)
    assert 0 <= ledger.reserved <= ledger.total == GPUS
    assert ledger.free >= 0
    assert ledger.free == ledger.total - ledger.reserved

    pinned = [ledger.resolve(i).index for c in accepted for i in c.device_ids]
    assert len(pinned) == len(set(pinned)), "a device is pinned twice"
    counted = sum(c.count for c in accepted if not c.device_ids and c.count > 0)
    # Fit kept the uncapped demand within the node, so the cap in `reserved` never hid anything.
    assert len(pinned) + counted <= GPUS
    if any(c.all for c in accepted):
        assert len(accepted) == 1
    for index in set(pinned):
        assert ledger.holder_of(index) is not None
