"""Throttled for long: how long power capping or thermal slowdown held a GPU's clocks down
within the last hour, from the throttle-time counters where the driver has them (R580 and
R590, tests/fakes/data/health/smi-1x-h100-r590.csv), else from the reasons active at each
collection (R535, smi-8x-a100-r535.csv), and the warning it gives."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.gpu import DockerInfo, SmiQuery, detect
from gpufleet.gpu.throttle import HOUR, ThrottleHistory, held_time, throttle_finding
from tests.fakes.memory import host
from tests.fakes.recorded import recording

START = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
DOCKER = DockerInfo(runtimes=("runc", "nvidia"))
MINUTE_US = 60_000_000


def r590_h100():
    runner = host(smi=recording("health/smi-1x-h100-r590.csv"))
    runner.help = recording("drivers/help-query-gpu-590.48.01.txt")
    (device,) = detect(runner, DOCKER, SmiQuery()).devices
    return device


def r535_gpu(index: int):
    return detect(host(smi=recording("health/smi-8x-a100-r535.csv")), DOCKER, SmiQuery()).devices[index]


H100 = r590_h100()
# The recording's own counters: 1.0232 s of power capping since the driver loaded, no heat.
RECORDED_POWER_US = H100.sw_power_cap_us


def collections(history: ThrottleHistory, readings, every=timedelta(minutes=5), start=START):
    """Remember one GPU state per collection, `every` apart; the time of the last one."""
    now = start
    for i, device in enumerate(readings):
        now = start + i * every
        history.remember([device], now)
    return now


def capped_for(minutes_per_collection: list[float]):
    """The H100 as read at successive collections, its power-cap counter grown by the
    given minutes since the collection before."""
    grown, states = 0.0, []
    for minutes in minutes_per_collection:
        grown += minutes
        states.append(replace(H100, sw_power_cap_us=RECORDED_POWER_US + int(grown * MINUTE_US),
                              throttle_reasons=("sw_power_cap",) if minutes else ()))
    return states


def test_the_counters_read_are_the_recordings():
    assert (H100.sw_power_cap_us, H100.sw_thermal_slowdown_us, H100.hw_thermal_slowdown_us,
            H100.hw_power_brake_slowdown_us) == (1023200, 0, 0, 0)


def test_a_gpu_power_capped_for_a_third_of_the_hour_warns_naming_it_reason_time_and_remedy():
    history = ThrottleHistory()
    # 13 collections 5 min apart: 12 spans, the power cap held 5 min in 4 of them.
    now = collections(history, capped_for([0, 0, 5, 5, 0, 0, 0, 5, 5, 0, 0, 0, 0]))
    held = held_time(history.of(H100.uuid), now)
    assert held.power_s == pytest.approx(20 * 60) and held.thermal_s == 0 and held.from_counters
    finding = throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.25)
    assert finding.code == "gpu0.throttle" and finding.status == "warn"
    assert finding.name == "GPU 0 (NVIDIA H100 80GB HBM3, PCI 00000000:00:09.0)"
    assert "power capping held its clocks down for 20 min of the last hour (33 %" in finding.message
    assert "lower clocks" in finding.message and "power limit" in finding.message
    assert "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i 0" in finding.fix
    assert "nvidia-smi -pl" in finding.fix


def test_below_the_share_says_nothing_and_the_share_is_a_setting():
    history = ThrottleHistory()
    now = collections(history, capped_for([0, 5, 5, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0]))  # 15 min
    assert throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.25) is None
    assert throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.2).status == "warn"
    # A share of 1 or more can never be passed: the warning is off.
    assert throttle_finding(H100, history.of(H100.uuid), now, warn_share=1) is None


def test_the_counters_win_over_the_reasons_seen_at_each_collection():
    history = ThrottleHistory()
    # sw_power_cap active at every collection, but the counter grew 1 min in all.
    states = [replace(state, throttle_reasons=("sw_power_cap",)) for state in capped_for([0] + [1 / 12] * 12)]
    now = collections(history, states)
    assert held_time(history.of(H100.uuid), now).power_s == pytest.approx(60, abs=1)
    assert throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.25) is None


def test_a_counter_that_went_down_is_a_driver_reload_not_negative_time():
    history = ThrottleHistory()
    states = capped_for([0, 5, 5, 5])
    # The driver reloaded between the 4th and 5th collection: its counter restarts from
    # 0 and grew 4 min since; then 5 min more.
    reloaded = replace(H100, sw_power_cap_us=4 * MINUTE_US, throttle_reasons=("sw_power_cap",))
    again = replace(H100, sw_power_cap_us=9 * MINUTE_US, throttle_reasons=("sw_power_cap",))
    now = collections(history, [*states, reloaded, again])
    assert held_time(history.of(H100.uuid), now).power_s == pytest.approx((15 + 4 + 5) * 60)


def test_a_counter_never_grows_by_more_than_the_time_between_two_collections():
    history = ThrottleHistory()
    # Power cap and power brake together for the whole 5 min, each counted in full.
    both = replace(H100, sw_power_cap_us=RECORDED_POWER_US + 5 * MINUTE_US, hw_power_brake_slowdown_us=10**12)
    now = collections(history, [H100, both])
    held = held_time(history.of(H100.uuid), now)
    assert held.power_s == pytest.approx(5 * 60) and held.held_s == pytest.approx(5 * 60)


def test_without_counters_the_share_of_collections_held_times_their_spacing_counts():
    a100 = r535_gpu(2)
    assert a100.sw_thermal_slowdown_us is None and a100.throttle_reasons == ()
    hot = replace(a100, throttle_reasons=("sw_thermal_slowdown",))
    history = ThrottleHistory()
    # 13 collections 5 min apart, 9 of the 12 spans ending in thermal slowdown: 45 min.
    now = collections(history, [a100, hot, hot, hot, a100, hot, hot, hot, a100, hot, hot, hot, a100])
    held = held_time(history.of(a100.uuid), now)
    assert held.thermal_s == pytest.approx(45 * 60) and held.power_s == 0 and not held.from_counters
    finding = throttle_finding(a100, history.of(a100.uuid), now, warn_share=0.25)
    assert finding.code == "gpu2.throttle" and "PCI 00000000:0C:00.0" in finding.name
    assert "thermal slowdown held its clocks down for 45 min of the last hour (75 %" in finding.message
    assert "active at 9 of 12 collections" in finding.message
    assert "airflow" in finding.fix and "fans" in finding.fix and "inlet" in finding.fix


def test_an_agent_watching_for_less_than_an_hour_compares_with_the_whole_hour():
    history = ThrottleHistory()
    # Started 20 min ago, power capped all along: 20 min is at least a third of the hour.
    now = collections(history, capped_for([0, 5, 5, 5, 5]))
    finding = throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.25)
    assert "20 min of the last hour" in finding.message and "watched it for 20 min" in finding.message
    # 10 of 10 minutes is all this agent saw, but only a sixth of the hour: no warning yet.
    history = ThrottleHistory()
    now = collections(history, capped_for([0, 5, 5]))
    assert throttle_finding(H100, history.of(H100.uuid), now, warn_share=0.25) is None


def test_one_reading_says_nothing():
    history = ThrottleHistory()
    history.remember([replace(H100, throttle_reasons=("sw_power_cap",))], START)
    assert held_time(history.of(H100.uuid), START).held_s == 0
    assert throttle_finding(H100, history.of(H100.uuid), START, warn_share=0.0) is None


def test_power_and_thermal_at_once_count_once_and_each_is_named():
    a100 = r535_gpu(0)
    both = replace(a100, throttle_reasons=("sw_power_cap", "sw_thermal_slowdown"))
    history = ThrottleHistory()
    now = collections(history, [a100] + [both] * 6)
    held = held_time(history.of(a100.uuid), now)
    assert held.held_s == pytest.approx(30 * 60) and held.power_s == held.thermal_s == pytest.approx(30 * 60)
    message = throttle_finding(a100, history.of(a100.uuid), now, warn_share=0.25).message
    assert "power capping and thermal slowdown held its clocks down for 30 min" in message


def test_the_history_keeps_one_hour_and_forgets_gpus_gone_for_an_hour():
    history = ThrottleHistory()
    # Two hours of collections a minute apart, capped for the first hour only.
    states = capped_for([0] + [1] * 60 + [0] * 60)
    now = collections(history, states, every=timedelta(minutes=1))
    kept = history.of(H100.uuid)
    assert len(kept) == 61 and kept[0].at == now - HOUR
    assert held_time(kept, now).held_s == 0
    history.remember([], now + HOUR + timedelta(seconds=1))
    assert history.of(H100.uuid) == ()


def test_the_history_is_bounded_however_often_the_agent_collects():
    history = ThrottleHistory(max_readings=10)
    collections(history, capped_for([1] * 50), every=timedelta(seconds=1))
    assert len(history.of(H100.uuid)) == 10


def test_a_clock_that_went_back_starts_the_gpu_again():
    history = ThrottleHistory()
    now = collections(history, capped_for([0, 5, 5, 5, 5]))
    history.remember([H100], now - timedelta(minutes=30))
    assert len(history.of(H100.uuid)) == 1
