"""How much one node may have accepted per collect interval.

An agent sends a snapshot each interval, and a few more for jobs ("diagnose now",
a fix); a host that floods the ingest in its own name must not take the time the
others' snapshots need. The ingest asks once a batch, for the entries whose signature
it checked (anyone may append entries naming any node: forged ones must not spend the
named node's share), before any inflating or JSON work; only about enrolled nodes, so
it holds at most the fleet's nodes. `SharedAdmission` is the consumers' (counted in
Redis, so that N consumers together still give a node the cap, not N times it);
`Admission` counts in the process (`manage.py collect --once`, tests)."""

from __future__ import annotations

import logging
import time
from collections import deque

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# Grants each node of the batch up to the cap within the last interval (a sliding
# window, by the server's clock), in one atomic step whatever the number of consumers.
# Each node's list holds the times of its grants, oldest first. KEYS[1]: the prefix of
# the lists; ARGV: cap, interval in ms, then node and wanted count pairs. Answers the
# count granted to each.
GRANT = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local cap, interval = tonumber(ARGV[1]), tonumber(ARGV[2])
local granted = {}
for i = 3, #ARGV, 2 do
    local key = KEYS[1] .. ARGV[i]
    local oldest = redis.call('LINDEX', key, 0)
    while oldest and tonumber(oldest) <= now - interval do
        redis.call('LPOP', key)
        oldest = redis.call('LINDEX', key, 0)
    end
    local n = math.min(tonumber(ARGV[i + 1]), math.max(0, cap - redis.call('LLEN', key)))
    for _ = 1, n do redis.call('RPUSH', key, now) end
    if n > 0 then redis.call('PEXPIRE', key, interval) end
    granted[#granted + 1] = n
end
return granted
"""


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

    def grant(self, wanted: dict[str, int], now: float) -> dict[str, int]:
        """How many of the entries `wanted` of each node may be accepted at `now` (the
        first ones of the batch); the rest are refused, and not counted."""
        return {node: sum(self.admit(node, now) for _ in range(count)) for node, count in wanted.items()}

    def give_back(self, granted: dict[str, int]) -> None:
        """Take back grants of the last `grant` that were not used (entries left for a
        later batch, which will ask again)."""
        for node, count in granted.items():
            times = self._admitted.get(node)
            for _ in range(min(count, len(times or ()))):
                times.pop()

    def __len__(self) -> int:
        """How many nodes it holds times for."""
        return len(self._admitted)

    def _sweep(self, now: float) -> None:
        if self._swept_at is not None and now - self._swept_at < self.interval_s:
            return
        self._swept_at = now
        cutoff = now - self.interval_s
        self._admitted = {node: times for node, times in self._admitted.items() if times and times[-1] > cutoff}


class SharedAdmission:
    """As Admission (at most `cap` admissions per node within any `interval_s`), counted
    in Redis by every consumer together, under keys `prefix` + node name, which expire
    an interval after a node's last grant: one script call a batch. While Redis is full
    (maxmemory) and refuses to record grants, each consumer counts by itself (Admission),
    so that the consumers read on and free it."""

    def __init__(self, client: redis.Redis, prefix: str, cap: int, interval_s: float) -> None:
        if cap < 1 or interval_s <= 0:
            raise ValueError(f"an admission cap needs cap >= 1 and interval_s > 0, not {cap} and {interval_s}")
        self.prefix, self.cap, self.interval_ms = prefix, cap, max(1, round(interval_s * 1000))
        self._client = client
        self._grant = client.register_script(GRANT)
        self._alone = Admission(cap, interval_s)
        self._alone_last = False

    @classmethod
    def from_settings(cls, client: redis.Redis, prefix: str) -> SharedAdmission:
        return cls(client, prefix, settings.GPUFLEET_INGEST_CAP_PER_INTERVAL, settings.GPUFLEET_COLLECT_INTERVAL)

    def grant(self, wanted: dict[str, int], now: float | None = None) -> dict[str, int]:
        """As Admission.grant, for every consumer together (`now` is Redis's own)."""
        if not wanted:
            return {}
        nodes = list(wanted)
        args = [self.cap, self.interval_ms, *(x for node in nodes for x in (node, wanted[node]))]
        try:
            counts = self._grant(keys=[self.prefix], args=args)
        except redis.exceptions.OutOfMemoryError:
            log.warning("Redis is full (maxmemory): this consumer caps each node by itself until it is not")
            self._alone_last = True
            return self._alone.grant(wanted, time.monotonic())
        self._alone_last = False
        return dict(zip(nodes, map(int, counts), strict=True))

    def give_back(self, granted: dict[str, int]) -> None:
        """As Admission.give_back (the newest grants of each node go)."""
        if not any(granted.values()):
            return
        if self._alone_last:
            self._alone.give_back(granted)
            return
        with self._client.pipeline(transaction=True) as pipe:
            for node, count in granted.items():
                if count:
                    pipe.rpop(self.prefix + node, count)
            pipe.execute()
