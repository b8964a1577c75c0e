"""The ingest task: where agents' snapshots arrive on the central site.

Agents send one message per snapshot to wire.INGEST_TASK (args: snapshot, job_id;
kwargs: auth, the node's signature). The snapshot is its JSON text (wire.encode_snapshot),
validated once, for the node it names, while the signature is checked over the text as
sent; agents of before that send the object. The worker takes them in batches
(celery-batches: up to GPUFLEET_INGEST_BATCH messages, or, while the pool has nothing
to do, what came within GPUFLEET_INGEST_FLUSH_S) and stores each batch in one
transaction (`ingest_snapshots`), each snapshot with the guarantees it has alone.
Nothing is written before a message's signature is checked and found to be that of the
node the snapshot reports on."""

from __future__ import annotations

import gc
import logging
import time

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from celery_batches import Batches, SimpleRequest, consume_queue
from celery_batches.trace import apply_batches_task
from django.conf import settings
from django.db import InterfaceError, OperationalError, close_old_connections
from kombu.transport.redis import QoS as RedisQoS
from kombu.transport.virtual import QoS as VirtualQoS

from gpufleet import wire
from gpufleet.fleet import credentials
from gpufleet.ingest.metrics import record_ingest
from gpufleet.ingest.services import REJECTED, IngestResult, finish_diagnosis, ingest_snapshots, show_rejection

log = logging.getLogger(__name__)

# Waits between tries when the database is unreachable (PostgreSQL restarting): about
# a minute in all, within CELERY_TASK_SOFT_TIME_LIMIT.
RETRY_DELAYS_S = (1, 2, 4, 8, 16, 30)
KEY_FIX = ("Give the node's agent its current key: on the central site run `manage.py enroll {name}` and put "
           "the GPUFLEET_AGENT_KEY line it prints into the agent's environment, then restart the agent.")


class IngestBatches(Batches):
    """celery-batches' Batches, which hands the pool a batch when it holds flush_every
    requests and, on each tick of a timer, whatever it holds; made to do the latter
    only while the pool has no batch out, and to survive losing the broker.

    Under load a batch is out, and what comes meanwhile gathers into a full one:
    handing over whatever was buffered on every tick gave a second pool process small
    batches, which cost the service's worker a fifth of its rate. While the pool idles,
    a tick hands over what came within flush_interval (0.1 s by default): the end of a
    backlog, a quiet fleet's lone snapshot. Not each message the moment the pool
    idles: that stores a moderate stream (500 snapshots/s, 15,000 nodes) in batches of
    two or three, each paying a batch's fixed cost (a snapshot alone costs ten times
    one in a batch of 200), and keeps the pool busy all the time.

    Batches starts its flush timer with the first buffered request and cancels it when
    the buffer is empty; when the worker loses the broker, Celery clears the event
    loop's timers, and Batches, still holding its dead timer, never starts another.
    Here the timer is started with each strategy (Celery builds them again on every
    reconnect, after clearing) and never cancelled. The requests still buffered came
    on the lost connection and can no longer be acknowledged: Redis hands their
    messages out again after the visibility timeout, so they are dropped rather than
    stored twice."""

    abstract = True

    def __init__(self) -> None:
        super().__init__()
        self._out: set[object] = set()  # a token for each batch handed to the pool, until it returns

    def Strategy(self, task, app, consumer):
        self._reconnected()
        handler = super().Strategy(task, app, consumer)
        self._tref = consumer.timer.call_repeatedly(self.flush_interval, self._flush_when_idle)
        return handler

    def _reconnected(self) -> None:
        """Forget what came on a lost broker connection (Celery builds the strategies
        again on every reconnect): the buffered requests, and the batches out. On losing
        the broker the pool drops the batches it had not begun to store, and their
        callbacks never come: counted as out, they kept the timer from handing over
        anything short of a full batch for good, so a lone snapshot was never stored.
        A batch the pool is still storing returns all the same; its token is gone."""
        dropped = len(list(consume_queue(self._buffer))) + len(list(consume_queue(self._pending)))
        if dropped:
            log.warning("dropped %d buffered ingest messages of a lost broker connection; "
                        "the broker delivers them again", dropped)
        self._out.clear()

    def _flush_when_idle(self) -> None:
        # Batches' flush cancels the timer when it finds nothing ready: call it only
        # when something is buffered.
        if not self._out and not self._buffer.empty():
            self._do_flush()

    def flush(self, requests):
        """Batches' flush for this acks_late task, but a batch that could not be stored
        for now (RETRY_LATER) goes back to the broker, to be taken again, instead of
        being acknowledged. Any other failure is logged and acknowledged, as Batches
        does, so that a batch which always fails cannot hold up the queue."""
        batch = ([_for_the_pool(r) for r in requests],)
        token = object()

        def on_return(result) -> None:
            self._out.discard(token)
            if result == RETRY_LATER:
                log.warning("gave %d ingest messages back to the broker: their batch could not be stored for now", len(requests))
                for request in requests:
                    request.reject(requeue=True)
            else:
                acknowledge(requests)

        def on_error(_) -> None:
            # The pool process died or ran past its hard time limit: the messages stay
            # unacknowledged, and the broker delivers them again.
            self._out.discard(token)

        self._out.add(token)  # before: a pool that runs the batch at once (solo) returns inside apply_async
        return self._pool.apply_async(apply_batches_task, (self, batch, 0, None), callback=on_return,
                                      error_callback=on_error)


def _for_the_pool(request) -> SimpleRequest:
    """A request as the pool process gets it: celery-batches' SimpleRequest without the
    message's headers (request_dict), which the ingest task never reads. Those hold the
    arguments again and their repr, a fifth of what the consumer pickled and piped to
    the pool process for each batch."""
    simple = SimpleRequest.from_request(request)
    simple.request_dict = {}
    return simple


def acknowledge(requests) -> None:
    """Acknowledge a batch's messages, those received from Redis in one round trip.
    kombu's Redis transport acknowledges each message with a round trip of its own (its
    two entries in the index of unacknowledged messages removed in a pipeline), and the
    worker's consumer waits for each; kombu offers no batch acknowledgement, hence
    this. A message of any other transport is acknowledged as Celery does it. If Redis is unreachable the messages
    stay in the index and Redis delivers them again after the visibility timeout (their
    snapshots are then stale): logged, as kombu logs a failed acknowledgement."""
    by_qos: dict[RedisQoS, list] = {}
    for request in requests:
        message = getattr(request, "message", None)
        qos = getattr(getattr(message, "channel", None), "qos", None)
        if isinstance(qos, RedisQoS) and not request.acknowledged:
            by_qos.setdefault(qos, []).append(request)
        else:
            request.acknowledge()
    for qos, received in by_qos.items():
        tags = [request.message.delivery_tag for request in received]
        try:
            with qos.pipe_or_acquire() as pipe:
                # What QoS._remove_from_indices does for one message, for all of them:
                # two commands, not two a message (3.3 ms of the consumer's time a
                # batch of 200, while the pool process waited for its next batch).
                pipe.zrem(qos.unacked_index_key, *tags).hdel(qos.unacked_key, *tags).execute()
        except qos.channel.connection_errors as exc:
            log.error("could not acknowledge %d ingest messages, the broker will deliver them again: %r",
                      len(received), exc)
        for request in received:
            # What kombu's and Celery's acknowledgement do once Redis has answered: the
            # message leaves the channel's prefetch window and is not acknowledged again.
            VirtualQoS.ack(qos, request.message.delivery_tag)
            request.message._state = "ACK"
            request.acknowledged = True


# The youngest generation's threshold in the ingest pool process: 10,000 new container
# objects between collections, against Python's 700.
GC_YOUNG_THRESHOLD = 10_000


@worker_process_init.connect
def collect_garbage_for_batches(**_) -> None:
    """Tune the cyclic garbage collector in the pool process that stores batches (only
    the ingest worker runs a prefork pool). A batch holds a few hundred thousand live
    objects (each snapshot's dicts, its pydantic models, its rows), and with Python's
    thresholds the collector went through them again and again as a batch was built:
    a fifth of storing one (in process, 8-GPU snapshots: 0.92 -> 0.71 ms of CPU each).
    What the process holds from its start (modules, Django, Celery) is frozen out of
    collections for good, and the young generation is collected less often; the
    garbage that only the collector frees (reference cycles) waits a little longer."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


# What the ingest task returns for a batch it could not store for now: the database
# unreachable for longer than its retries, or the batch past its soft time limit.
RETRY_LATER = "retry later"


@shared_task(base=IngestBatches, name=wire.INGEST_TASK, ignore_result=True,
             flush_every=settings.GPUFLEET_INGEST_BATCH, flush_interval=settings.GPUFLEET_INGEST_FLUSH_S)
def ingest(requests: list) -> list[str]:
    """Store the snapshots of a batch of agents' messages (celery-batches' requests);
    one outcome per message, in order. The messages are acknowledged (acks_late) once
    this returns, or given back to the broker when it returns RETRY_LATER."""
    try:
        return ingest_messages([(list(r.args), dict(r.kwargs)) for r in requests])
    except (OperationalError, InterfaceError, SoftTimeLimitExceeded) as exc:
        log.error("could not store a batch of %d snapshots, will take them again: %s", len(requests), exc)
        return RETRY_LATER


def ingest_message(snapshot: dict, job_id: int | None = None, auth: dict | None = None) -> str:
    """One message's outcome: a batch of one."""
    return ingest_messages([([snapshot, job_id], {"auth": auth})])[0]


def ingest_messages(messages: list[tuple[list, dict]]) -> list[str]:
    """Check each message's signature, store the snapshots of those that pass in one
    batch, and finish the "diagnose now" jobs they answer."""
    started = time.monotonic()
    outcomes: list[str | None] = [None] * len(messages)
    signed = _signers(messages)
    stored = [(i, args, signer) for i, (args, signer) in enumerate(signed) if signer is not _REFUSED]
    results: list[IngestResult] = []
    if stored:
        results = store_with_retries([args[0] for _, args, _ in stored])
    elapsed = time.monotonic() - started
    for (i, args, signer), result in zip(stored, results, strict=True):
        outcomes[i] = result.outcome
        if len(args) > 1 and args[1] is not None:
            finish_diagnosis(args[1], result, node=signer)
    for i, outcome in enumerate(outcomes):
        outcomes[i] = outcome or REJECTED
        record_ingest(outcomes[i], elapsed)
    return outcomes  # type: ignore[return-value]


_REFUSED = object()


def _signers(messages: list[tuple[list, dict]]) -> list[tuple[list, object]]:
    """Each message's args and the node that signed it (None: unsigned, let in by
    GPUFLEET_ACCEPT_UNSIGNED), or _REFUSED, its refusal logged and, where it is the
    node's own message signed with an old key, shown on the node's page."""
    auths = [kwargs.get("auth") if isinstance(kwargs, dict) else None for _, kwargs in messages]
    key_for = with_retries(lambda: credentials.keys_for(auths), "checking signatures")
    signed = []
    for (args, kwargs), auth in zip(messages, auths, strict=True):
        # Validated once, for the node it names; the signature is checked over args as sent.
        snapshot = _parsed(args[0]) if isinstance(args, list) and args else None
        try:
            if not isinstance(args, list) or not 1 <= len(args) <= 2 or set(kwargs) - {"auth"}:
                raise wire.SignatureError("the message is malformed: expected args (snapshot, job_id) and auth")
            signer = credentials.sender(auth, wire.INGEST_TASK, args, key_for)
            # One that names no node at all is malformed: the store rejects it with its reason.
            claimed = _node_named(snapshot, default=signer)
            if signer is not None and claimed != signer:
                raise wire.SignatureError(f"node {signer!r} signed a snapshot of another node")
        except wire.SignatureError as exc:
            _refuse(exc, auth, args, snapshot)
            signed.append((args, _REFUSED))
            continue
        signed.append(([snapshot, *args[1:]], signer))
    return signed


def _parsed(snapshot):
    """The snapshot validated (a wire.Snapshot, which the store takes as it is), or where
    it is invalid, decoded, or where its text is not JSON, the text: the store rejects
    those with the reason parse_snapshot gives."""
    try:
        return wire.parse_snapshot(snapshot)
    except wire.SnapshotError:
        pass
    try:
        return wire.decode_snapshot(snapshot)
    except wire.SnapshotError:
        return snapshot


def _node_named(snapshot, default=None):
    """The node a snapshot (as `_parsed` gives it) says it is of; `default` where it names none."""
    if isinstance(snapshot, wire.Snapshot):
        return snapshot.node
    return snapshot.get("node", default) if isinstance(snapshot, dict) else default


def _refuse(exc: wire.SignatureError, auth, args, snapshot) -> None:
    claimed = _node_named(snapshot)
    # The name comes from the message: bounded, and repr() so it cannot forge log lines.
    # An unsigned snapshot comes from an agent that was never given a key: say how to enrol it.
    enrol = " (enrol the node: `manage.py enroll NAME` here, the key it prints to its agent)" if auth is None else ""
    log.warning("refused a snapshot for node %s: %s%s", repr(claimed)[:wire.LINE_MAX], exc, enrol)
    if isinstance(args, list) and with_retries(
        lambda: credentials.signed_with_old_key(auth, wire.INGEST_TASK, args), "checking a signature"
    ):
        show_rejection(auth["node"], str(exc), KEY_FIX.format(name=auth["node"]))


def with_retries(work, what: str, delays=RETRY_DELAYS_S):
    """`work()`, tried again after each of `delays` while the database is unreachable;
    the last error is raised (the worker logs it; the message, acked late, stays in
    the broker only if the worker dies meanwhile)."""
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
