"""The central ingest: a consumer of the agents' Redis stream (`manage.py ingest`).

Agents append one entry per snapshot or job report (wire.encode_entry). Consumers of
the group wire.INGEST_GROUP read a batch (XREADGROUP COUNT n BLOCK ms), handle it, and
acknowledge it (XACK, and XDEL, so the stream holds only what is not stored yet);
nothing clever in between. An entry is pending from the moment Redis hands it out
until its acknowledgement, which comes only after its batch committed: a consumer
killed at any instant leaves its entries pending, and another consumer takes them over
(XAUTOCLAIM) once they are idle for GPUFLEET_BROKER_VISIBILITY_TIMEOUT. An entry stored
twice that way is a snapshot not newer than the stored one: ignored as stale.

Each entry is checked cheapest first: its node and key generation are an enrolled
node's current ones, the HMAC matches, it is no copy of an entry of its batch or of one
handled lately (a replay), the node is within its admission cap (counted in
Redis across the consumers, one call a batch), the body inflates within bounds to a
payload of the right shape; then the batch's snapshots are
stored in one transaction (services.ingest_snapshots). Refused entries are counted per
node and reason, acknowledged, and never stored."""

from __future__ import annotations

import gc
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections

from gpufleet import wire
from gpufleet.core.broker import ack_and_delete, ingest_key, new_trims
from gpufleet.events import services as events
from gpufleet.fleet import broker_users, credentials
from gpufleet.fleet.models import Refusal
from gpufleet.ingest import schema
from gpufleet.ingest.admission import Admission, SharedAdmission
from gpufleet.ingest.metrics import record_batch, record_dead_letter, record_snapshot
from gpufleet.ingest.refusals import count_refusals
from gpufleet.ingest.services import STALE, finish_diagnosis, ingest_snapshots
from gpufleet.jobs.models import JobStatus
from gpufleet.jobs.services import report_progress

log = logging.getLogger(__name__)

# Waits between tries while the database is unreachable (PostgreSQL restarting): about
# a minute in all; then the consumer backs off and tries the same entries again.
RETRY_DELAYS_S = (1, 2, 4, 8, 16, 30)
# The longest wait between tries to reach Redis or the database again.
BACKOFF_MAX_S = 30.0
# How stale the map of enrolled nodes may be (a rotation or revocation takes as long).
KEYS_REFRESH_S = 10.0
# What one batch's bodies may inflate to in all (each one is bound by wire.ENTRY_INFLATED_MAX).
BATCH_INFLATED_MAX = 64 * 2**20
# The youngest generation's threshold in a consumer: 10,000 new container objects
# between collections, against Python's 700.
GC_YOUNG_THRESHOLD = 10_000

REFUSED = "rejected"  # as a snapshot the store rejects, for the counters
# An entry left for the next batch: this one's bodies inflated to BATCH_INFLATED_MAX.
DEFERRED = "deferred"
# An entry whose handling raised (a bug): left pending, and taken again once; failing as
# many times as DEAD_AFTER says, it is DEAD: set aside in the dead-letter stream, acknowledged.
FAILED, DEAD = "failed", "dead"
DEAD_AFTER = 2
# The dead letters kept (the oldest go first), and the most of an error each one keeps.
DEAD_LETTERS_MAX = 1000
ERROR_MAX = 500
# A dead letter holds the entry's own fields under this prefix, beside its id, node and error.
FIELD = b"field:"
# Never an entry's fault: Redis's errors, and the database unreachable (run() waits those out).
PASSED_ON = (redis.RedisError, OperationalError, InterfaceError)


class NodeKeys:
    """The enrolled nodes' current keys, as entries are checked against them: the
    generations are read from the database every KEYS_REFRESH_S, and the names a batch
    brings that are not known yet in one query for the batch (a node just enrolled is
    known at once; a flood of made-up names costs one query a batch). Keys are derived once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._generations: dict[str, int] = {}
        self._keys: dict[tuple[str, int], wire.NodeKey] = {}
        self._read_at: float | None = None

    def prepare(self, names: set[str]) -> None:
        """Make sure what is known of `names` is current enough to check a batch by."""
        if self._read_at is None or self._clock() - self._read_at > KEYS_REFRESH_S:
            self._generations = with_retries(credentials.current_generations, "reading the enrolled nodes")
            self._keys = {k: v for k, v in self._keys.items() if self._generations.get(k[0]) == k[1]}
            self._read_at = self._clock()
        elif missing := names - self._generations.keys():
            self._generations |= with_retries(lambda: credentials.current_generations(missing),
                                              "reading the enrolled nodes")

    def key(self, node: str, generation: int) -> wire.NodeKey | Refusal:
        """`node`'s key when `generation` is its current one, else why not."""
        current = self._generations.get(node)
        if current is None:
            return Refusal.UNKNOWN_NODE
        if current != generation:
            return Refusal.OLD_KEY if generation < current else Refusal.BAD_SIGNATURE
        if (node, generation) not in self._keys:
            self._keys[node, generation] = credentials.node_key(node, generation)
        return self._keys[node, generation]


@dataclass
class _Snapshot:
    position: int
    node: str
    text: str
    job_id: int | None


def ingest_entries(entries: list[dict], keys: NodeKeys | None = None,
                   admission: Admission | SharedAdmission | None = None) -> list[str]:
    """Check and store a batch of entries' fields (as Redis gives them); one outcome per
    entry, in order: a snapshot's ("accepted", "stale", "rejected"), "progress" for a job
    report taken, REFUSED for an entry refused before its payload was trusted, DEFERRED
    for one to be handled in a later batch (not to be acknowledged now). Raises
    OperationalError/InterfaceError when the database stays unreachable past the
    retries: then nothing of the batch may be acknowledged."""
    # `is None`, not `or`: an Admission holding no node yet is empty (falsy), and one made
    # anew per batch would cap a node per batch instead of per collect interval.
    keys = NodeKeys() if keys is None else keys
    admission = Admission.from_settings() if admission is None else admission
    started = time.monotonic()
    outcomes: list[str] = [REFUSED] * len(entries)
    refused: Counter[tuple[str, str]] = Counter()
    snapshots: list[_Snapshot] = []
    reports: list[tuple[int, str, list]] = []
    budget = BATCH_INFLATED_MAX
    read: list[wire.Entry | None] = []
    for fields in entries:
        try:
            read.append(wire.read_entry(fields))
        except wire.EntryError as exc:
            read.append(None)
            # Anyone may append junk, as much as Redis holds: a batch logs the first one's
            # reason, and counts the rest (logged below), never a line each.
            if not refused["", Refusal.MALFORMED]:
                _log_refusal("", str(exc))
            refused["", Refusal.MALFORMED] += 1
    keys.prepare({entry.node for entry in read if entry is not None})
    verdicts = [None if entry is None else _verdict(entry, keys) for entry in read]
    _refuse_replays(read, verdicts, admission, started)
    # The signature before the cap: anyone may append entries naming any node, and only
    # what the node really signed may spend its share (HMAC is cheap; inflating is not).
    # One grant for the batch: shared by the consumers, it is a round trip to Redis.
    left = admission.grant(Counter(entry.node for entry, verdict in zip(read, verdicts, strict=True)
                                   if verdict is True), started)
    taken: list[tuple[str, str]] = []
    for position, (entry, verdict) in enumerate(zip(read, verdicts, strict=True)):
        if budget < wire.ENTRY_INFLATED_MAX:
            outcomes[position:] = [DEFERRED] * (len(entries) - position)
            break
        if entry is None:
            continue
        if verdict is not True:
            refused[entry.node, verdict] += 1
            continue
        if not left.get(entry.node):
            refused[entry.node, Refusal.OVER_CAP] += 1
            continue
        left[entry.node] -= 1
        taken.append((entry.node, entry.sig))
        try:
            payload, inflated = wire.entry_payload(entry)
        except wire.EntryError as exc:
            # What was inflated before the refusal cost the same as what is kept.
            budget -= exc.inflated
            refused[entry.node, Refusal.TOO_LARGE if isinstance(exc, wire.EntryTooLarge) else Refusal.MALFORMED] += 1
            _log_refusal(entry.node, str(exc))
            continue
        budget -= inflated
        if entry.kind == wire.SNAPSHOT:
            snapshots.append(_Snapshot(position, entry.node, payload[0], payload[1]))
        else:
            reports.append((position, entry.node, payload))
    # What was granted to entries left for a later batch, which will ask again.
    admission.give_back(left)
    _store(snapshots, outcomes, refused)
    for position, node, (job_id, status, output, error) in reports:
        if status not in JobStatus.values:
            refused[node, Refusal.MALFORMED] += 1
            continue
        with_retries(lambda j=job_id, s=status, o=output, e=error, n=node: report_progress(j, s, o, e, node=n),
                     "reporting job progress")
        outcomes[position] = "progress"
    # Once handled (stored, or stale): taken again, as after a lost acknowledgement, it is a replay.
    admission.remember(taken, started)
    if refused:
        for (node, reason), count in sorted(refused.items()):
            # An agent never enrolled signs with no key the site knows: say how to enrol it.
            enrol = " (enrol the node: `manage.py enroll NAME` here, the key it prints to its agent)" \
                if reason == Refusal.UNKNOWN_NODE else ""
            log.warning("refused %d ingest entries of node %r: %s%s", count, node[: wire.LINE_MAX], reason, enrol)
        with_retries(lambda: count_refusals(dict(refused)), "counting refusals")
    if handled := sum(outcome != DEFERRED for outcome in outcomes):
        record_batch(handled, time.monotonic() - started)
    return outcomes


def _refuse_replays(read: list[wire.Entry | None], verdicts: list, admission: Admission | SharedAdmission,
                    now: float) -> None:
    """Refuse as replays the signed entries that an earlier one of the batch, or one handled
    lately, has the signature of: before the cap, so that copies of a node's genuine entry,
    which anyone who got hold of it may append, never spend that node's share."""
    signed = [(position, (entry.node, entry.sig)) for position, (entry, verdict)
              in enumerate(zip(read, verdicts, strict=True)) if verdict is True]
    replays = admission.seen(list(dict.fromkeys(pair for _, pair in signed)), now)
    for position, pair in signed:
        if pair in replays:
            verdicts[position] = Refusal.REPLAY
        replays.add(pair)


def _verdict(entry: wire.Entry, keys: NodeKeys) -> Refusal | bool:
    """True when `entry` is signed with its node's current key, else why it is refused."""
    key = keys.key(entry.node, entry.generation)
    if key == Refusal.OLD_KEY and not wire.entry_signed_with(entry, credentials.node_key(entry.node, entry.generation)):
        # Only what the node's old key really signed says its agent kept that key.
        return Refusal.BAD_SIGNATURE
    if isinstance(key, Refusal):
        return key
    return True if wire.entry_signed_with(entry, key) else Refusal.BAD_SIGNATURE


def _store(snapshots: list[_Snapshot], outcomes: list[str], refused: Counter) -> None:
    parsed = [_parsed(s.text) for s in snapshots]
    mine = []
    for snapshot, data in zip(snapshots, parsed, strict=True):
        named = data.node if isinstance(data, schema.Snapshot) else data.get("node") if isinstance(data, dict) else None
        if named is not None and named != snapshot.node:
            # Signed by one node, about another: the one place a node could speak for another.
            refused[snapshot.node, Refusal.MALFORMED] += 1
            _log_refusal(snapshot.node, f"a snapshot of node {str(named)[: wire.LINE_MAX]!r}")
            continue
        mine.append((snapshot, data))
    if not mine:
        return
    results = store_with_retries([data for _, data in mine])
    for (snapshot, _), result in zip(mine, results, strict=True):
        outcomes[snapshot.position] = result.outcome
        record_snapshot(result.outcome)
        if result.outcome == STALE:
            refused[snapshot.node, Refusal.REPLAY] += 1
        if snapshot.job_id is not None:
            with_retries(lambda s=snapshot, r=result: finish_diagnosis(s.job_id, r, node=s.node), "finishing a job")


def _parsed(text: str):
    """The snapshot validated (a schema.Snapshot), or where it is invalid the decoded
    object or the text itself: the store rejects those with the reason it gives."""
    try:
        return schema.parse_snapshot(text)
    except wire.SnapshotError:
        pass
    try:
        return wire.decode_snapshot(text)
    except wire.SnapshotError:
        return text


def _log_refusal(node: str, reason: str) -> None:
    # The name and reason come from the entry: bounded, and repr() so they cannot forge log lines.
    log.warning("refused an ingest entry of node %r: %s", node[: wire.LINE_MAX], reason[: wire.LINE_MAX])


def with_retries(work, what: str, delays=RETRY_DELAYS_S):
    """`work()`, tried again after each of `delays` while the database is unreachable;
    then the last error is raised, and the batch stays unacknowledged."""
    for delay in (*delays, None):
        try:
            return work()
        except (OperationalError, InterfaceError) as exc:
            if delay is None:
                raise
            log.warning("database unreachable while %s (%s); retrying in %s s", what, exc, delay)
            close_old_connections()  # a broken connection is replaced on the next try
            time.sleep(delay)
    raise AssertionError("unreachable")


def store_with_retries(snapshots: list, delays=RETRY_DELAYS_S):
    """`ingest_snapshots`, with the retries of `with_retries`."""
    return with_retries(lambda: ingest_snapshots(snapshots), f"storing {len(snapshots)} snapshots", delays)


def consumer_name() -> str:
    """This process's name in the group: host and pid, unique while it lives."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def tune_garbage_collector() -> None:
    """A batch holds a few hundred thousand live objects (each snapshot's dicts and
    models, its rows), through which Python's default thresholds run the collector
    again and again. What the process holds from its start (modules, Django) is frozen
    out of collections, and the young generation collected less often. Kept because
    one consumer falls short of its target beside the COPY floor without it
    (docs/performance.md)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class Consumer:
    """One consumer of the ingest group: `run()` until `stop()` (a signal handler may
    call it); the batch in hand is finished and acknowledged first."""

    def __init__(self, client: redis.Redis, *, stream: str | None = None, group: str = wire.INGEST_GROUP,
                 name: str | None = None, batch: int | None = None, block_ms: int | None = None,
                 claim_idle_s: float | None = None, handle: Callable[[list[dict]], list[str]] | None = None):
        self.client = client
        # Its name (what the settings and the logs say) and its key, which holds a token.
        self.stream = stream or settings.GPUFLEET_INGEST_STREAM
        self.key = ingest_key(self.stream)
        self.group = group
        self.name = name or consumer_name()
        self.batch = batch or settings.GPUFLEET_INGEST_BATCH
        self.block_ms = block_ms or settings.GPUFLEET_INGEST_BLOCK_MS
        self.claim_idle_ms = int(1000 * (claim_idle_s or settings.GPUFLEET_BROKER_VISIBILITY_TIMEOUT))
        # Look for a dead consumer's entries a few times per visibility timeout.
        self.claim_every_s = min(10.0, self.claim_idle_ms / 3000)
        keys, admission = NodeKeys(), SharedAdmission.from_settings(client, f"{self.key}:admitted:")
        self.handle = handle or (lambda fields: ingest_entries(fields, keys, admission))
        self.stopping = False
        self._group_ready = False
        self._own_pending = True  # at the start and after a failed batch: take those again first
        self._next_claim = 0.0

    def stop(self, *_) -> None:
        self.stopping = True

    def run(self) -> None:
        delay = 1.0
        while not self.stopping:
            try:
                self.step()
                delay = 1.0
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("lost Redis (%s); trying again in %.0f s", exc, delay)
                # What it was handed and could not acknowledge is taken again first.
                self._group_ready, self._own_pending = False, True
                delay = self._pause(delay)
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("the ingest group is gone (Redis restarted without its data?); creating it again")
                self._group_ready = False
            except (OperationalError, InterfaceError) as exc:
                log.error("could not store a batch, the database is unreachable (%s); trying again in %.0f s",
                          exc, delay)
                close_old_connections()
                self._own_pending = True
                delay = self._pause(delay)

    def _pause(self, delay: float) -> float:
        deadline = time.monotonic() + delay
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        return min(BACKOFF_MAX_S, delay * 2)

    def ensure_group(self) -> None:
        """Load what the agents run (broker_users.prepare: at the start, and again after a
        lost connection, as Redis may have restarted with an empty script cache), and
        create the group (and the stream) if missing; from the stream's first entry, so
        entries appended before any consumer ran are stored too."""
        try:
            broker_users.prepare(self.client, self.stream)
            self.client.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except redis.exceptions.OutOfMemoryError:
            # Redis at its maxmemory refuses what would take more (these too, the group
            # there or not); reading, acknowledging and deleting free it, and go on.
            log.warning("Redis is full (maxmemory): reading on to free it, without loading the append function")
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def step(self) -> int:
        """Read one batch, handle it, acknowledge it; the number of entries handled."""
        if not self._group_ready:
            self.ensure_group()
        entries = self.read()
        if not entries:
            return 0
        # An entry trimmed while pending comes back without its fields: nothing to store.
        live = [(entry_id, fields) for entry_id, fields in entries if fields]
        outcomes = self._handled(live)
        deferred = {entry_id for (entry_id, _), outcome in zip(live, outcomes, strict=True)
                    if outcome in (DEFERRED, FAILED)}
        if deferred:
            self._own_pending = True
        self.acknowledge([entry_id for entry_id, _ in entries if entry_id not in deferred])
        return len(entries) - len(deferred)

    def _handled(self, live: list[tuple[bytes, dict]]) -> list[str]:
        """`handle`'s outcomes for `live`; an entry whose handling raises what is no loss of
        Redis or of the database (a bug) is FAILED or, the second time, DEAD."""
        try:
            return self.handle([fields for _, fields in live])
        except PASSED_ON:
            raise
        except Exception as exc:
            if len(live) == 1:
                return [self._failed(*live[0], exc)]
            log.warning("a batch of %d ingest entries failed (%r); handling them one at a time", len(live), exc)
        # One snapshot is all-or-nothing inside its batch: alone, the good ones are stored.
        outcomes = []
        for entry_id, fields in live:
            try:
                outcomes += self.handle([fields])
            except PASSED_ON:
                raise
            except Exception as exc:
                outcomes.append(self._failed(entry_id, fields, exc))
        return outcomes

    def _failed(self, entry_id: bytes, fields: dict, exc: Exception) -> str:
        """FAILED (left pending, to be taken again) the first time, else DEAD: set aside."""
        [pending] = self.client.xpending_range(self.key, self.group, min=entry_id, max=entry_id, count=1) or [{}]
        node = fields.get(b"node", b"")[: wire.LINE_MAX].decode(errors="replace")
        if pending.get("times_delivered", 0) < DEAD_AFTER:
            log.exception("ingest entry %s of node %r failed; it is taken again once", entry_id.decode(), node,
                          exc_info=exc)
            self._own_pending = True
            return FAILED
        error = f"{type(exc).__name__}: {exc}"[:ERROR_MAX]
        letter = self.client.xadd(dead_letter_key(self.key), {
            b"id": entry_id, b"node": node, b"error": error, b"consumer": self.name,
            **{FIELD + name: value for name, value in fields.items()},
        }, maxlen=DEAD_LETTERS_MAX, approximate=True).decode()
        log.error("ingest entry %s of node %r failed again (%s): set aside as dead letter %s",
                  entry_id.decode(), node, error, letter, exc_info=exc)
        record_dead_letter()
        with_retries(lambda: events.ingest_dead_letter(node, error, letter), "recording a dead letter")
        return DEAD

    def read(self) -> list[tuple[bytes, dict | None]]:
        if time.monotonic() >= self._next_claim:
            self._next_claim = time.monotonic() + self.claim_every_s
            self._report_trims()
            claimed = self.claim()
            if claimed:
                self._next_claim = 0.0  # there may be more
                return claimed
        if self._own_pending:
            entries = self._read("0", block=None)
            if entries:
                return entries
            self._own_pending = False
        return self._read(">", block=self.block_ms)

    def _read(self, start: str, block: int | None) -> list[tuple[bytes, dict | None]]:
        got = self.client.xreadgroup(self.group, self.name, {self.key: start}, count=self.batch, block=block)
        return list(got[0][1]) if got else []

    def claim(self) -> list[tuple[bytes, dict | None]]:
        """Entries another consumer was handed and did not acknowledge within the
        visibility timeout (it died, or hangs), or at once when it was of this host and
        its process is gone (`up` restarted): now this one's."""
        consumers = self.client.xinfo_consumers(self.key, self.group)
        if taken := self._take_from_gone(consumers):
            return taken
        _, claimed, deleted = self.client.xautoclaim(self.key, self.group, self.name, self.claim_idle_ms,
                                                      start_id="0-0", count=self.batch)
        if deleted:
            # Trimmed while pending: among the trims _report_trims tells (as an error), once.
            log.warning("%d of the entries trimmed from the stream unstored had been handed to a consumer",
                        len(deleted))
        if claimed:
            log.warning("took over %d ingest entries a consumer did not acknowledge within %.0f s",
                        len(claimed), self.claim_idle_ms / 1000)
        self._forget_idle_consumers(consumers)
        return claimed

    def _take_from_gone(self, consumers: list[dict]) -> list[tuple[bytes, dict | None]]:
        host = socket.gethostname()
        for consumer in consumers:
            name = consumer["name"].decode()
            consumer_host, _, pid = name.rpartition(":")
            if consumer["pending"] and consumer_host == host and name != self.name and pid.isdigit() \
                    and not _running(int(pid)):
                pending = self.client.xpending_range(self.key, self.group, min="-", max="+", count=self.batch,
                                                     consumername=name)
                taken = self.client.xclaim(self.key, self.group, self.name, 0,
                                           [entry["message_id"] for entry in pending])
                log.warning("took over %d ingest entries of consumer %s, which no longer runs", len(taken), name)
                if taken:
                    return taken
        return []

    def acknowledge(self, ids: list[bytes]) -> None:
        if ids:
            ack_and_delete(self.client, self.key, self.group, ids)

    def _forget_idle_consumers(self, consumers: list[dict]) -> None:
        # Every process joins under a name of its own: those that hold nothing and were
        # idle for long are gone.
        for consumer in consumers:
            if consumer["pending"] == 0 and consumer["idle"] > 10 * self.claim_idle_ms \
                    and consumer["name"].decode() != self.name:
                self.client.xgroup_delconsumer(self.key, self.group, consumer["name"])

    def _report_trims(self) -> None:
        if trimmed := new_trims(self.client, self.stream):
            log.error("%d ingest entries were trimmed from the stream before they were stored: raise "
                      "GPUFLEET_INGEST_STREAM_MAXLEN or add consumers", trimmed)


def dead_letter_key(key: str) -> str:
    """The dead-letter stream of the ingest stream at `key`."""
    return f"{key}:dead-letters"


def dead_letters(client: redis.Redis, stream: str | None = None) -> list[tuple[str, dict[str, str]]]:
    """The dead letters of the ingest stream, oldest first: (id, its entry's id, node and error)."""
    return [(letter.decode(), {k: fields.get(k.encode(), b"").decode(errors="replace") for k in ("id", "node", "error")})
            for letter, fields in client.xrange(dead_letter_key(ingest_key(stream)))]


def replay_dead_letter(client: redis.Redis, letter: str, stream: str | None = None) -> str | None:
    """Dead letter `letter`'s entry appended to the ingest stream again (as it was sent) and
    the letter removed; the node the entry names, or None when there is no such letter."""
    key = ingest_key(stream)
    found = client.xrange(dead_letter_key(key), letter, letter)
    if not found:
        return None
    fields = found[0][1]
    entry = {name[len(FIELD):]: value for name, value in fields.items() if name.startswith(FIELD)}
    with client.pipeline(transaction=True) as pipe:
        pipe.xadd(key, entry, maxlen=settings.GPUFLEET_INGEST_STREAM_MAXLEN, approximate=True)
        pipe.xdel(dead_letter_key(key), letter)
        pipe.execute()
    return fields.get(b"node", b"").decode(errors="replace")


def in_process(entries: Iterable[dict]) -> list[str]:
    """Entries handled here and now, as a consumer would (collect --once, tests)."""
    return ingest_entries(list(entries))
