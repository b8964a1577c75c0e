"""When the ingest worker hands its buffered messages to the pool (IngestBatches):
when it holds a full batch, and on each tick of its timer while the pool has no batch
out. The pool here is a stand-in that holds each batch until the test returns it; the
real worker's behaviour is in tests/integration/test_pipeline.py."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from celery_batches import consume_queue

from gpufleet.ingest import tasks


class HeldPool:
    """A pool of `num_processes` that runs nothing: each batch waits for the test to
    return it (`finish`) or to lose its process (`lose`)."""

    def __init__(self, num_processes: int):
        self.num_processes = num_processes
        self.batches: list[tuple[list, object, object]] = []

    def apply_async(self, target, args, callback, error_callback):
        requests = args[1][0]
        self.batches.append((requests, callback, error_callback))

    def sizes(self) -> list[int]:
        return [len(requests) for requests, _, _ in self.batches]

    def finish(self, i: int, result=None) -> None:
        self.batches[i][1](result or ["accepted"] * len(self.batches[i][0]))

    def lose(self, i: int) -> None:
        self.batches[i][2](RuntimeError("the pool process died"))


@pytest.fixture
def batcher(monkeypatch):
    """The ingest task's batcher, batches of up to 4, with `batcher.receive(n)` doing
    what a message's arrival does, `batcher.tick()` what its timer does, and
    `batcher.with_pool(n)` giving it a HeldPool of n processes."""
    task = tasks.ingest._get_current_object()
    monkeypatch.setattr(task, "_out", set())
    monkeypatch.setattr(task, "flush_every", 4)
    monkeypatch.setattr(task, "_count", itertools.count(1))
    monkeypatch.setattr(tasks, "_for_the_pool", lambda request: request)
    acknowledged = []
    monkeypatch.setattr(tasks, "acknowledge", acknowledged.extend)

    def receive(n: int) -> None:
        """celery-batches' handler: buffer the message, flush every flush_every."""
        for _ in range(n):
            task._buffer.put(SimpleNamespace(eta=None, reject=lambda requeue: None))
            if not next(task._count) % task.flush_every:
                task._do_flush()

    def with_pool(processes: int) -> HeldPool:
        pool = HeldPool(processes)
        monkeypatch.setattr(task, "_pool", pool)
        return pool

    task.receive, task.tick, task.with_pool, task.acknowledged = receive, task._flush_when_idle, with_pool, acknowledged
    yield task
    list(consume_queue(task._buffer))
    del task.receive, task.tick, task.with_pool, task.acknowledged


def test_an_idle_pool_gets_what_came_at_the_next_tick(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(1)
    assert pool.sizes() == []
    batcher.tick()
    assert pool.sizes() == [1]
    batcher.tick()
    assert pool.sizes() == [1]  # nothing more came


def test_while_a_batch_is_out_the_ticks_let_messages_gather_into_a_full_batch(batcher):
    pool = batcher.with_pool(2)
    batcher.receive(1)
    batcher.tick()
    batcher.receive(3)
    batcher.tick()
    assert pool.sizes() == [1]  # the second process waits for a full batch
    batcher.receive(1)
    assert pool.sizes() == [1, 4]
    assert len(batcher._out) == 2


def test_a_returned_batch_is_acknowledged_and_the_pool_takes_the_rest_at_the_next_tick(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(1)
    batcher.tick()
    batcher.receive(3)
    pool.finish(0)
    assert batcher.acknowledged and len(batcher.acknowledged) == 1
    assert pool.sizes() == [1]
    batcher.tick()
    assert pool.sizes() == [1, 3]


@pytest.mark.parametrize("ending", ["given back for later", "its process died"])
def test_a_batch_that_ends_unstored_is_not_acknowledged_and_frees_the_pool(batcher, ending):
    """Given back (the database unreachable: RETRY_LATER), or lost with its pool process:
    either way the broker delivers its messages again, and the pool takes the next."""
    pool = batcher.with_pool(1)
    batcher.receive(1)
    batcher.tick()
    batcher.receive(2)
    if ending == "given back for later":
        pool.finish(0, tasks.RETRY_LATER)
    else:
        pool.lose(0)
    batcher.tick()
    assert batcher.acknowledged == []
    assert pool.sizes() == [1, 2]
    assert len(batcher._out) == 1


def test_after_a_reconnect_batches_the_pool_dropped_no_longer_hold_up_the_rest(batcher):
    """On losing the broker the pool drops the batches it had not begun (their callbacks
    never come), and Celery builds the strategy again: after that, the next tick hands
    over what came, and a batch still being stored that returns changes nothing."""
    pool = batcher.with_pool(1)
    batcher.receive(1)
    batcher.tick()
    batcher.receive(4)  # a full batch, queued behind the first, that the pool drops
    assert pool.sizes() == [1, 4]
    batcher._reconnected()
    batcher.receive(1)
    batcher.tick()
    assert pool.sizes() == [1, 4, 1]
    pool.finish(0)  # the batch the pool was storing when the broker went
    batcher.receive(1)
    batcher.tick()
    assert pool.sizes() == [1, 4, 1]  # the third is out
    pool.finish(2)
    batcher.tick()
    assert pool.sizes() == [1, 4, 1, 1]
