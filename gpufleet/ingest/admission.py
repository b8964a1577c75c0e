"""How much one node may have accepted per collect interval.

An agent sends a snapshot each interval, and a few more for jobs ("diagnose now",
a fix); a host that floods the ingest in its own name must not take the time the
others' snapshots need. The ingest asks once a batch, for the entries whose signature
it checked (anyone may append entries naming any node: forged ones must not spend the
named node's share), before any inflating or JSON work; only about enrolled nodes, so
it holds at most the fleet's nodes. `SharedAdmission` is the consumers' (counted in
Redis, so that N consumers together still give a node the cap, not N times it);
`Admission` counts in the process (`manage.py collect --once`, tests).

Both also remember the entries (by their signature) handled within the last
SEEN_INTERVALS intervals: a copy of one, which anyone who got hold of it can append
again and again, is a replay, refused before it may spend the node's cap."""

from __future__ import annotations

import logging
import time
from collections import deque

import redis
from django.conf import settings

log = logging.getLogger(__name__)

# How long a handled entry's signature is remembered, in collect intervals: a node's
# memory holds at most its cap times this many.
SEEN_INTERVALS = 10

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

# Remembers each signature of a node's entries handled now, in a sorted set per node (by
# the server's clock), and forgets those older than the window. KEYS[1]: the prefix of
# the sets; ARGV: window in ms, then node and signature pairs.
REMEMBER = """
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
    local key = KEYS[1] .. ARGV[i]
    redis.call('ZADD', key, now, ARGV[i + 1])
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    redis.call('PEXPIRE', key, window)
end
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
        self._seen: dict[str, dict[str, float]] = {}
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

    def seen(self, entries: list[tuple[str, str]], now: float) -> set[tuple[str, str]]:
        """Which of `entries` (node, signature) were handled within the last SEEN_INTERVALS
        intervals before `now`."""
        cutoff = now - SEEN_INTERVALS * self.interval_s
        return {(node, sig) for node, sig in entries if self._seen.get(node, {}).get(sig, cutoff) > cutoff}

    def remember(self, entries: list[tuple[str, str]], now: float) -> None:
        """`entries` (node, signature) handled at `now`."""
        self._sweep(now)
        for node, sig in entries:
            self._seen.setdefault(node, {})[sig] = now

    def __len__(self) -> int:
        """How many nodes it holds times for."""
        return len(self._admitted)

    def _sweep(self, now: float) -> None:
        if self._swept_at is not None and now - self._swept_at < self.interval_s:
            return
        self._swept_at = now
        cutoff = now - self.interval_s
        self._admitted = {node: times for node, times in self._admitted.items() if times and times[-1] > cutoff}
        cutoff = now - SEEN_INTERVALS * self.interval_s
        self._seen = {node: kept for node, sigs in self._seen.items()
                      if (kept := {sig: at for sig, at in sigs.items() if at > cutoff})}


class SharedAdmission:
    """As Admission (at most `cap` admissions per node within any `interval_s`), counted
    in Redis by every consumer together, under keys `prefix` + node name, which expire
    an interval after a node's last grant: one script call a batch; the signatures
    handled under `prefix` + "seen:" + node name (a node name holds no colon). While Redis
    is full (maxmemory) and refuses to record grants, each consumer counts by itself
    (Admission), so that the consumers read on and free it."""

    def __init__(self, client: redis.Redis, prefix: str, cap: int, interval_s: float) -> None:
        if cap < 1 or interval_s <= 0:
            raise ValueError(f"an admission cap needs cap >= 1 and interval_s > 0, not {cap} and {interval_s}")
        self.prefix, self.cap, self.interval_ms = prefix, cap, max(1, round(interval_s * 1000))
        self._client = client
        self._grant = client.register_script(GRANT)
        self._remember = client.register_script(REMEMBER)
        self.window_ms = SEEN_INTERVALS * self.interval_ms
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

    def seen(self, entries: list[tuple[str, str]], now: float | None = None) -> set[tuple[str, str]]:
        """As Admission.seen, for every consumer together: one round trip."""
        if not entries:
            return set()
        with self._client.pipeline(transaction=False) as pipe:
            for node, sig in entries:
                pipe.zscore(f"{self.prefix}seen:{node}", sig)
            *scores, (seconds, micros) = pipe.time().execute()
        # What the window left behind is only forgotten at the node's next remember.
        oldest = seconds * 1000 + micros // 1000 - self.window_ms
        return {entry for entry, score in zip(entries, scores, strict=True) if score is not None and score > oldest}

    def remember(self, entries: list[tuple[str, str]], now: float | None = None) -> None:
        """As Admission.remember; while Redis is full, not remembered (a copy is then
        stale at the store, as before)."""
        if not entries:
            return
        try:
            self._remember(keys=[f"{self.prefix}seen:"], args=[self.window_ms, *(x for entry in entries for x in entry)])
        except redis.exceptions.OutOfMemoryError:
            log.warning("Redis is full (maxmemory): the entries handled now are not remembered as seen")
