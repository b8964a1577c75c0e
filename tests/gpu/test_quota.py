"""Team quotas, pure: GPUs at once (a sweep, not a sum), by model, GPU-hours per calendar
month and GPU-hours booked beyond the next 24 hours."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from gpufleet.gpu import Claim, Ledger
from gpufleet.gpu.quota import (
    GPU_HOURS_PER_MONTH,
    MAX_GPU_HOURS_AHEAD,
    MAX_GPUS,
    MAX_GPUS_BY_MODEL,
    Holding,
    Quota,
    check,
    holding,
    standing,
)
from tests.gpu.test_placement import A100, H200, info

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)  # a Monday noon
DAYS = timedelta(days=30)  # GPUFLEET_MAX_RESERVATION_DAYS


def at(hours: float) -> datetime:
    return NOW + timedelta(hours=hours)


def held(gpus: int, start: float, end: float | None, name: str = "c") -> Holding:
    return Holding(name, gpus, at(start), None if end is None else at(end))


def test_no_quota_refuses_nothing():
    assert check(Quota(), [held(100, 0, None)], [held(100, 0, None)], NOW, DAYS) is None


def test_gpus_at_once_are_the_peak_of_the_windows_not_their_sum():
    quota = Quota(max_gpus=4)
    # Two 4-GPU bookings one after the other (half-open windows: the second starts as the first ends).
    assert check(quota, [held(4, 24, 48)], [held(4, 48, 72)], NOW, DAYS) is None
    exceeded = check(quota, [held(4, 24, 48), held(1, 60, 61)], [held(4, 47, 72, "eval")], NOW, DAYS)
    assert exceeded is not None and exceeded.code == "quota_exceeded"
    assert (exceeded.quota, exceeded.limit, exceeded.held, exceeded.asks, exceeded.at) == (MAX_GPUS, 4, 4, 4, at(47))
    assert str(exceeded) == ("the booking is over the team's quota of 4 GPUs at once: from Wed 9 Dec 11:00 UTC"
                             " the team holds 4 and the booking asks 4 more")


def test_the_first_instant_over_is_named_even_when_the_booking_starts_within_the_quota():
    exceeded = check(Quota(max_gpus=4), [held(1, 0, 10), held(3, 5, 6)], [held(2, 0, 10)], NOW, DAYS)
    assert (exceeded.held, exceeded.asks, exceeded.at) == (4, 2, at(5))


def test_an_open_ended_claim_holds_its_gpus_at_once_for_all_time():
    exceeded = check(Quota(max_gpus=4), [held(3, -100, None)], [held(2, 24 * 365, 24 * 365 + 1)], NOW, DAYS)
    assert exceeded is not None and exceeded.held == 3


def test_a_booking_of_several_windows_counts_all_of_them():
    series = [held(2, 24 * week, 24 * week + 8, f"lab-{week}") for week in range(0, 28, 7)]
    assert check(Quota(max_gpus=2), [], series, NOW, DAYS) is None
    exceeded = check(Quota(max_gpus=3), [held(2, 24 * 14 + 4, 24 * 14 + 5)], series, NOW, DAYS)
    assert exceeded.at == at(24 * 14 + 4)


def test_gpus_of_a_model_count_against_that_models_quota_only():
    node = info(H200, H200, A100, A100)
    ledger = Ledger(node, [])
    h200s = holding(Claim("h", device_ids=("0", "1"), starts_at=at(0), ends_at=at(8)), ledger, NOW)
    a100s = holding(Claim("a", device_ids=("2", "3"), starts_at=at(0), ends_at=at(8)), ledger, NOW)
    quota = Quota(max_gpus_by_model={"h200": 2})
    assert check(quota, [h200s], [a100s], NOW, DAYS) is None
    exceeded = check(quota, [a100s], [h200s, holding(Claim("x", device_ids=("0",), starts_at=at(4), ends_at=at(6)),
                                                             ledger, NOW)], NOW, DAYS)
    assert (exceeded.quota, exceeded.model, exceeded.held, exceeded.asks) == (MAX_GPUS_BY_MODEL, "h200", 0, 3)
    assert str(exceeded).startswith("the booking is over the team's quota of 2 h200 GPUs at once")


def test_a_count_on_a_node_of_two_models_counts_against_each_up_to_what_the_node_has():
    ledger = Ledger(info(H200, A100, A100, A100), [])
    three = holding(Claim("c", count=3, starts_at=at(0), ends_at=at(1)), ledger, NOW)
    assert (three.gpus, three.of_model("H200"), three.of_model("A100")) == (3, 1, 3)
    whole = holding(Claim("all", starts_at=at(0), ends_at=at(1)), ledger, NOW)
    assert (whole.gpus, whole.of_model("H200"), whole.of_model("a100")) == (4, 1, 3)


def test_a_pinned_gpu_the_node_no_longer_reports_still_counts():
    ledger = Ledger(info(H200, H200), [])
    assert holding(Claim("p", device_ids=("0", "GPU-gone")), ledger, NOW).gpus == 2
    assert holding(Claim("p", device_ids=("0",)), ledger, NOW).starts_at == NOW


def test_monthly_gpu_hours_count_each_part_of_a_booking_in_its_own_month():
    quota = Quota(gpu_hours_per_month=100)
    # 4 GPUs from Dec 31 12:00 to Jan 1 12:00: 48 GPU-hours in December, 48 in January.
    new_year = datetime(2026, 12, 31, 12, tzinfo=UTC)
    booking = Holding("nye", 4, new_year, new_year + timedelta(days=1))
    december = Holding("dec", 2, datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, 2, tzinfo=UTC))  # 52, past
    january = Holding("jan", 1, datetime(2027, 1, 10, tzinfo=UTC), datetime(2027, 1, 12, 4, tzinfo=UTC))  # 52
    assert check(quota, [december], [booking], NOW, DAYS) is None  # 52 + 48 = 100
    assert check(quota, [january], [booking], NOW, DAYS) is None
    exceeded = check(quota, [december, Holding("one", 1, at(0), at(1))], [booking], NOW, DAYS)
    assert (exceeded.quota, exceeded.held, exceeded.asks) == (GPU_HOURS_PER_MONTH, 53, 48)
    assert exceeded.at == datetime(2026, 12, 1, tzinfo=UTC)
    assert str(exceeded) == ("the booking is over the team's quota of 100 GPU-hours a month: in December 2026 the"
                             " team has reserved 53 GPU-hours and the booking asks 48 more")
    exceeded = check(quota, [january, Holding("one", 1, datetime(2027, 1, 20, tzinfo=UTC),
                                             datetime(2027, 1, 20, 1, tzinfo=UTC))], [booking], NOW, DAYS)
    assert exceeded.at == datetime(2027, 1, 1, tzinfo=UTC) and exceeded.held == 53


def test_months_are_the_sites_calendar_months():
    paris = ZoneInfo("Europe/Paris")
    now = NOW.astimezone(paris)
    # 23:30 UTC on Dec 31 is already January in Paris.
    late = Holding("late", 1, datetime(2026, 12, 31, 23, 30, tzinfo=UTC), datetime(2027, 1, 1, 0, 30, tzinfo=UTC))
    exceeded = check(Quota(gpu_hours_per_month=0), [], [late], now, DAYS)
    assert exceeded.at == datetime(2027, 1, 1, tzinfo=paris) and exceeded.asks == 1


def test_an_open_ended_claim_counts_its_hours_until_the_longest_window_from_now():
    quota = Quota(gpu_hours_per_month=10_000)
    team = [held(8, -24, None)]  # since Sunday noon, no end: counted to Jan 6 noon
    st = standing(team, NOW, DAYS)
    assert st.month_so_far == 8 * 24
    assert st.month_total == 8 * (24 + 24 * 24 + 12)  # Dec 6 noon to Jan 1
    exceeded = check(quota, team, [Holding("jan", 100, datetime(2027, 1, 2, tzinfo=UTC),
                                            datetime(2027, 1, 2, 1, tzinfo=UTC))], NOW, DAYS)
    assert exceeded is None  # 8 * 132 + 100
    exceeded = check(Quota(gpu_hours_per_month=1000), team, [Holding("jan", 1, datetime(2027, 1, 2, tzinfo=UTC),
                                                                      datetime(2027, 1, 2, 1, tzinfo=UTC))], NOW, DAYS)
    assert exceeded.held == 8 * (5 * 24 + 12)


def test_hours_ahead_are_only_those_beyond_the_next_24_hours():
    quota = Quota(max_gpu_hours_ahead=10)
    soon = held(4, 2, 6)  # in 2 hours for 4: at short notice, not ahead
    assert check(quota, [], [soon], NOW, DAYS) is None
    assert check(quota, [held(10, 72, 73)], [soon], NOW, DAYS) is None
    in_three_days = held(4, 72, 76)
    exceeded = check(quota, [], [in_three_days], NOW, DAYS)
    assert (exceeded.quota, exceeded.held, exceeded.asks) == (MAX_GPU_HOURS_AHEAD, 0, 16)
    assert str(exceeded) == ("the booking is over the team's quota of 10 GPU-hours booked beyond the next 24 hours:"
                             " the team holds 0 such GPU-hours and the booking asks 16 more")
    # Across the line only the part beyond it counts: 2 GPUs from 20 h to 28 h ask 8.
    assert check(quota, [held(3, 30, 31)], [held(2, 20, 28)], NOW, DAYS).asks == 8
    assert check(Quota(max_gpu_hours_ahead=10), [held(1, 30, 32)], [held(2, 20, 28)], NOW, DAYS) is None


def test_an_open_ended_claim_ahead_counts_until_the_longest_window():
    exceeded = check(Quota(max_gpu_hours_ahead=100), [], [held(1, 0, None)], NOW, DAYS)
    assert exceeded.asks == 30 * 24 - 24


def test_the_first_quota_exceeded_is_answered_in_order():
    quota = Quota(max_gpus=1, max_gpus_by_model={"x": 0}, gpu_hours_per_month=0, max_gpu_hours_ahead=0)
    assert check(quota, [], [held(2, 48, 49)], NOW, DAYS).quota == MAX_GPUS
    assert check(Quota(max_gpu_hours_ahead=0, gpu_hours_per_month=0), [], [held(2, 48, 49)], NOW, DAYS).quota \
        == GPU_HOURS_PER_MONTH


@pytest.mark.parametrize("after, refused", [
    (held(4, 0, 10), False),  # unchanged: a new name, say
    (held(2, 2, 8), False),  # shorter and fewer
    (held(4, 0, 11), True),  # longer
    (held(5, 0, 10), True),  # more GPUs
    (held(4, -1, 10), True),  # earlier
])
def test_an_edit_asking_no_more_than_the_claim_held_is_never_refused(after, refused):
    before = held(4, 0, 10)
    quota = Quota(max_gpus=2)  # lowered since the claim was made
    assert (check(quota, [], [after], NOW, DAYS, before=[before]) is not None) is refused


def test_a_claim_of_no_gpus_asks_nothing():
    assert check(Quota(max_gpus=0), [], [held(0, 0, 1)], NOW, DAYS) is None


def test_standing_says_what_the_team_holds_now_and_ahead():
    team = [held(2, -1, 1), held(3, 2, 4), held(1, 48, 50), held(4, -48, -40)]
    st = standing(team, NOW, DAYS)
    assert (st.gpus_now, st.bookings_ahead, st.gpu_hours_ahead) == (2, 2, 2)
    assert st.month_so_far == 2 * 1 + 4 * 8
    assert st.month_total == 2 * 2 + 3 * 2 + 1 * 2 + 4 * 8
    assert st.month == datetime(2026, 12, 1, tzinfo=UTC)
