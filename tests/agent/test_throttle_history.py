"""Throttled for long, as the agent sees it: its own last hour of each GPU's throttling,
kept in memory between collections, through the fake nvidia-smi answering from the R590
H100 recording (its throttle-time counters grown as a power-capped GPU's grow) while
time-machine moves the clock from one collection to the next."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet.agent import host as agent_host
from gpufleet.gpu.throttle import ThrottleHistory
from tests.fakes.recorded import DATA_DIR

START = datetime(2026, 12, 3, 16, 0, tzinfo=UTC)
COUNTER = "clocks_event_reasons_counters.sw_power_cap"
REASON = "clocks_event_reasons.sw_power_cap"
RECORDING = DATA_DIR / "health" / "smi-1x-h100-r590.csv"
HELP = DATA_DIR / "drivers" / "help-query-gpu-590.48.01.txt"


@pytest.fixture
def h100(fake_host, tmp_path):
    """Make nvidia-smi print the recorded H100 with its power-cap counter grown by
    `capped_s` and the reason active or not."""
    header, row = RECORDING.read_text().splitlines()
    columns = [name.split(" [")[0] for name in header.split(", ")]

    def show(capped_s: float, active: bool) -> None:
        values = row.split(", ")
        counter = columns.index(COUNTER)
        values[counter] = str(int(values[counter]) + int(capped_s * 1e6))
        values[columns.index(REASON)] = "Active" if active else "Not Active"
        path = tmp_path / f"smi-{capped_s:.0f}.csv"
        path.write_text(f"{header}\n{', '.join(values)}\n")
        fake_host.smi(path, help=HELP)

    return show


def throttle(diagnosis):
    return next((f for f in diagnosis.findings if f.code == "gpu0.throttle"), None)


def test_an_h100_power_capped_for_long_warns_from_the_agents_last_hour(h100, settings, monkeypatch):
    assert settings.GPUFLEET_THROTTLE_WARN_SHARE == 0.25
    capped = 0.0
    with time_machine.travel(START, tick=False) as clock:
        h100(capped, active=False)
        assert throttle(agent_host.diagnose_this_host()) is None
        # Every 5 min a collection; power capped 4 of every 5 min from the 3rd on.
        for n in range(1, 13):
            clock.shift(timedelta(minutes=5))
            capped += 240 if n >= 3 else 0
            h100(capped, active=n >= 3)
            found = throttle(agent_host.diagnose_this_host())
            # 12 min held after the 5th collection: not yet a quarter of the hour; 16 after the 6th.
            assert (found is None) == (n <= 5), n
        assert capped == 40 * 60
        assert found.status == "warn"
        assert found.name == "GPU 0 (NVIDIA H100 80GB HBM3, PCI 00000000:00:09.0)"
        assert "power capping held its clocks down for 40 min of the last hour (67 %" in found.message
        assert "nvidia-smi -pl <watts> -i 0" in found.fix

        # The share is the agent's setting.
        settings.GPUFLEET_THROTTLE_WARN_SHARE = 0.75
        assert throttle(agent_host.diagnose_this_host()) is None
        settings.GPUFLEET_THROTTLE_WARN_SHARE = 0.25

        # An hour on, the early collections have left the window: 60 min, all capped.
        for _ in range(6):
            clock.shift(timedelta(minutes=10))
            capped += 600
            h100(capped, active=True)
            found = throttle(agent_host.diagnose_this_host())
        assert "held its clocks down for 60 min of the last hour (100 %" in found.message
        assert "watched" not in found.message

        # A restarted agent starts a new hour: nothing until it has seen enough again.
        monkeypatch.setattr(agent_host, "THROTTLE", ThrottleHistory())
        clock.shift(timedelta(minutes=5))
        capped += 300
        h100(capped, active=True)
        assert throttle(agent_host.diagnose_this_host()) is None
