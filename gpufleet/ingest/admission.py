"""How much one node may have accepted per collect interval.

An agent sends a snapshot each interval, and a few more for jobs ("diagnose now",
a fix); a host that floods the ingest in its own name must not take the time the
others' snapshots need. `Admission` is asked once an entry's signature is checked
(anyone may append entries naming any node: forged ones must not spend the named
node's share) and before any inflating or JSON work; only about enrolled nodes, so it
holds at most the fleet's nodes."""

from __future__ import annotations

from collections import deque

from django.conf import settings


class Admission:
    """At most `cap` admissions per node within any `interval_s` (a sliding window).
    Memory: `cap` times for each node admitted within the last interval; nodes quiet
    for longer are forgotten once an interval."""

    def __init__(self, cap: int, interval_s: float) -> None:
        if cap < 1 or interval_s <= 0:
            raise ValueError(f"an admission cap needs cap >= 1 and interval_s > 0, not {cap} and {interval_s}")
        self.cap = cap
        self.interval_s = interval_s
        self._admitted: dict[str, deque[float]] = {}
        self._swept_at: float | None = None

    @classmethod
    def from_settings(cls) -> Admission:
        return cls(settings.GPUFLEET_INGEST_CAP_PER_INTERVAL, settings.GPUFLEET_COLLECT_INTERVAL)

    def admit(self, node: str, now: float) -> bool:
        """Whether `node` may have one more message accepted at `now` (seconds, any
        monotonic clock); a refusal is not counted against it."""
        self._sweep(now)
        times = self._admitted.get(node)
        if times is None:
            times = self._admitted[node] = deque(maxlen=self.cap)
        while times and times[0] <= now - self.interval_s:
            times.popleft()
        if len(times) >= self.cap:
            return False
        times.append(now)
        return True

    def __len__(self) -> int:
        """How many nodes it holds times for."""
        return len(self._admitted)

    def _sweep(self, now: float) -> None:
        if self._swept_at is not None and now - self._swept_at < self.interval_s:
            return
        self._swept_at = now
        cutoff = now - self.interval_s
        self._admitted = {node: times for node, times in self._admitted.items() if times and times[-1] > cutoff}
