"""Throttled for long: how long power capping or thermal slowdown held a GPU's clocks down
within the last hour, and the warning it gives past a share of the hour. Pure: the doctor
calls it with what this agent process remembered of each GPU (ThrottleHistory).

A GPU that throttles at one collection says little (the one-sample findings of
diagnosis.py cover the acute cases); one held down for much of an hour runs its work
slower all along. Where the driver keeps throttle-time counters (R580 and later,
`clocks_event_reasons_counters.*`, microseconds since the driver loaded) their growth
says how long; elsewhere the reasons active at each collection stand for the time since
the collection before."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

from gpufleet.gpu.devices import Device
from gpufleet.gpu.findings import Finding, Status
from gpufleet.gpu.links import label

# The share of the last hour a GPU may be held by power capping or heat before it warns
# (GPUFLEET_THROTTLE_WARN_SHARE on the agent).
DEFAULT_THROTTLE_WARN_SHARE = 0.25

HOUR = timedelta(hours=1)
# The reasons counted, by kind. The generic hw_slowdown is not: it stands for heat, a
# power brake or a fast power trigger alike, and has no counter.
POWER = ("sw_power_cap", "hw_power_brake_slowdown")
THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
REASONS = POWER + THERMAL
# One reading a second (GPUFLEET_COLLECT_INTERVAL's minimum) for an hour: the bound on
# what one GPU's history holds, whatever asks for collections besides the schedule.
MAX_READINGS = 3601

MEANING = {
    "power": "power capping means its power limit is below what the work draws, or the power supply or rack"
             " budget holds it down",
    "thermal": "thermal slowdown means it runs too hot: airflow, fans, dust or the inlet temperature",
}
COMMON_REMEDY = "nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE -i {index} shows the active reasons, limits and temperatures."
POWER_REMEDY = (" Power: compare its enforced power limit with the default one (at the default, full load reaching it"
                " is normal); where the power supply and the rack"
                " budget allow, raise it with nvidia-smi -pl <watts> -i {index}.")
THERMAL_REMEDY = (" Thermal: check its fans and airflow (blocked inlets, dust filters) and the inlet temperature of"
                  " the rack.")


@dataclass(frozen=True)
class Reading:
    """One GPU at one collection: when, its throttle-time counters (µs, in REASONS'
    order, None where the driver has none) and the reasons active then (None when the
    driver reported none)."""

    at: datetime
    counters: tuple[int | None, ...]
    active: frozenset[str] | None

    @classmethod
    def of(cls, device: Device, at: datetime) -> Reading:
        reasons = device.throttle_reasons
        return cls(at, tuple(getattr(device, f"{reason}_us") for reason in REASONS),
                   None if reasons is None else frozenset(reasons) & frozenset(REASONS))


class ThrottleHistory:
    """What this agent process saw of each GPU (by UUID) over the last hour: kept in
    memory like the NVLink counters, since the counters are the driver's own and the
    agent that reads them needs no stored state; a restarted agent starts a new hour."""

    def __init__(self, max_readings: int = MAX_READINGS) -> None:
        self.max_readings = max_readings
        self._readings: dict[str, deque[Reading]] = {}

    def remember(self, devices: Iterable[Device], now: datetime) -> None:
        for device in devices:
            readings = self._readings.setdefault(device.uuid, deque(maxlen=self.max_readings))
            if readings and readings[-1].at > now:
                readings.clear()  # the clock went back: no span before now can be trusted
            readings.append(Reading.of(device, now))
        for uuid in list(self._readings):
            readings = self._readings[uuid]
            while readings and readings[0].at < now - HOUR:
                readings.popleft()
            if not readings:
                del self._readings[uuid]

    def of(self, uuid: str) -> tuple[Reading, ...]:
        return tuple(self._readings.get(uuid, ()))


@dataclass(frozen=True)
class Held:
    """Seconds held down within the readings: by power capping, by thermal slowdown, by
    either (overlaps counted once where the readings can tell, else the longer of the
    two: a lower bound), over how many seconds watched, and how."""

    power_s: float
    thermal_s: float
    held_s: float
    watched_s: float
    from_counters: bool
    spans: int  # pairs of successive readings
    spans_held: int  # of them, ending with a reason active (where no counter said)


def held_time(readings: Sequence[Reading], now: datetime) -> Held:
    """How long the readings within the hour before `now` say the GPU was held down.
    Each span between two readings counts a counter's growth in it (a counter that went
    down was reset by a driver reload: what it counts since is all within the span),
    never more than the span; a reason without a counter counts the whole span when it
    was active at the span's end."""
    kept = [r for r in readings if now - HOUR <= r.at <= now]
    power = thermal = either = 0.0
    from_counters, spans, spans_held = False, 0, 0
    for before, after in pairwise(kept):
        span = (after.at - before.at).total_seconds()
        if span <= 0:
            continue
        spans += 1
        held = {}
        for i, reason in enumerate(REASONS):
            old, new = before.counters[i], after.counters[i]
            if old is not None and new is not None:
                from_counters = True
                grown = new - old if new >= old else new
                held[reason] = min(grown / 1e6, span)
            else:
                held[reason] = span if after.active is not None and reason in after.active else 0.0
        span_power, span_thermal = max(held[r] for r in POWER), max(held[r] for r in THERMAL)
        power += span_power
        thermal += span_thermal
        either += max(span_power, span_thermal)
        spans_held += bool(after.active)
    watched = (kept[-1].at - kept[0].at).total_seconds() if kept else 0.0
    return Held(power, thermal, either, watched, from_counters, spans, spans_held)


def throttle_finding(device: Device, readings: Sequence[Reading], now: datetime,
                     warn_share: float = DEFAULT_THROTTLE_WARN_SHARE) -> Finding | None:
    """A warning when power capping or thermal slowdown held the GPU down for more than
    `warn_share` of the last hour. The held time is compared with the whole hour even
    when the agent has watched for less: what it saw is a lower bound."""
    held = held_time(readings, now)
    hour = HOUR.total_seconds()
    if held.held_s <= 0 or held.held_s <= warn_share * hour:
        return None
    # A kind counts when it alone held the GPU for a tenth of the held time or more.
    kinds = [kind for kind, seconds in (("power", held.power_s), ("thermal", held.thermal_s))
             if seconds >= held.held_s / 10]
    names = " and ".join({"power": "power capping", "thermal": "thermal slowdown"}[k] for k in kinds)
    message = (f"Throttled for long: {names} held its clocks down for {_minutes(held.held_s)} of the last hour"
               f" ({held.held_s / hour * 100:.0f} %, warning above {warn_share * 100:g} %)")
    if not held.from_counters:
        message += f", active at {held.spans_held} of {held.spans} collections"
    if held.watched_s < hour - 1:
        message += f"; this agent has watched it for {_minutes(held.watched_s)}"
    meaning = "; ".join(MEANING[k] for k in kinds)
    message += f": work on it runs at lower clocks. {meaning[0].upper()}{meaning[1:]}."
    fix = COMMON_REMEDY + (POWER_REMEDY if "power" in kinds else "") + (THERMAL_REMEDY if "thermal" in kinds else "")
    return Finding(f"gpu{device.index}.throttle", label(device), Status.WARN, message, fix.format(index=device.index))


def _minutes(seconds: float) -> str:
    return f"{round(seconds / 60)} min" if seconds >= 60 else f"{round(seconds)} s"
