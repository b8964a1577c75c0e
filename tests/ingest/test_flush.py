"""When the ingest worker hands its buffered messages to the pool (IngestBatches): at
once while a pool process has nothing to do, else when a batch comes back or the
buffer fills. The pool here is a stand-in that holds each batch until the test
returns it; the real worker's behaviour is in tests/integration/test_pipeline.py."""

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
    """The ingest task's batcher with a HeldPool of one process (`batcher.pool`), and
    `batcher.receive(n)` doing what a message's arrival does."""
    task = tasks.ingest._get_current_object()
    monkeypatch.setattr(task, "_out", 0)
    monkeypatch.setattr(tasks, "_for_the_pool", lambda request: request)
    acknowledged = []
    monkeypatch.setattr(tasks, "acknowledge", acknowledged.extend)

    monkeypatch.setattr(task, "_count", itertools.count(1))

    def receive(n: int) -> None:
        """What a message's arrival does: celery-batches' handler buffers it and flushes
        every flush_every messages, then IngestBatches' flushes if the pool is idle."""
        for _ in range(n):
            task._buffer.put(SimpleNamespace(eta=None, reject=lambda requeue: None))
            if not next(task._count) % task.flush_every:
                task._do_flush()
            task._flush_when_idle()

    def with_pool(processes: int) -> HeldPool:
        pool = HeldPool(processes)
        monkeypatch.setattr(task, "_pool", pool)
        return pool

    task.receive, task.with_pool, task.acknowledged = receive, with_pool, acknowledged
    yield task
    list(consume_queue(task._buffer))
    del task.receive, task.with_pool, task.acknowledged


def test_an_idle_pool_process_takes_a_message_at_once(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(1)
    assert pool.sizes() == [1]


def test_messages_that_come_while_the_process_is_busy_go_as_one_batch_when_it_returns(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(1)
    batcher.receive(37)
    assert pool.sizes() == [1]  # the 37 wait: the one process is storing the first
    pool.finish(0)
    assert pool.sizes() == [1, 37]
    assert len(batcher.acknowledged) == 1  # the first batch's message, once it was stored
    pool.finish(1)
    assert pool.sizes() == [1, 37] and len(batcher.acknowledged) == 38


def test_a_batch_given_back_for_later_frees_its_process_too(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(2)
    pool.finish(0, tasks.RETRY_LATER)
    assert batcher.acknowledged == []
    assert pool.sizes() == [1, 1]


def test_a_batch_whose_process_died_frees_its_slot_without_acknowledging(batcher):
    pool = batcher.with_pool(1)
    batcher.receive(1)
    batcher.receive(5)
    pool.lose(0)
    assert pool.sizes() == [1, 5]
    assert batcher.acknowledged == []  # the broker delivers the lost batch's message again
    assert batcher._out == 1


def test_with_more_processes_messages_still_gather_while_a_batch_is_out(batcher):
    """A second process that took whatever came while the first stored its batch would
    make small batches under load: the buffer waits for a full batch, or for the pool
    to have nothing to do."""
    pool = batcher.with_pool(2)
    batcher.receive(1)
    batcher.receive(9)
    assert pool.sizes() == [1]
    pool.finish(0)
    assert pool.sizes() == [1, 9]


def test_a_full_buffer_goes_to_the_pool_even_while_a_batch_is_out(batcher, monkeypatch):
    monkeypatch.setattr(batcher, "flush_every", 4)
    pool = batcher.with_pool(2)
    batcher.receive(1)
    batcher.receive(4)
    assert pool.sizes() == [1, 4]
    assert batcher._out == 2
    batcher.receive(3)
    pool.finish(0)
    assert pool.sizes() == [1, 4]  # one batch still out: the three wait for a fourth
    pool.finish(1)
    assert pool.sizes() == [1, 4, 3]
