"""The ingest worker's pool: Celery's prefork pool whose pipes to pool processes hold
most of a batch (gpufleet/ingest/pool.py)."""

from __future__ import annotations

import fcntl

import pytest
from celery import concurrency

from gpufleet.celery import app
from gpufleet.ingest import pool


def test_workers_that_run_a_prefork_pool_run_this_one():
    assert concurrency.get_implementation(app.conf.worker_pool) is pool.TaskPool
    assert pool.TaskPool.Pool is pool.AsynPool


def _queues():
    """The queues the pool makes for a process it starts."""
    made = pool.AsynPool.__new__(pool.AsynPool)  # only the queues: no processes started
    made.synack = False
    inq, outq, _ = made.create_process_queues()
    return inq, outq


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux's")
def test_the_pipe_to_a_pool_process_holds_a_mebibyte():
    inq, outq = _queues()
    try:
        assert fcntl.fcntl(inq._writer.fileno(), fcntl.F_GETPIPE_SZ) == pool.pipe_bytes() == 2**20
    finally:
        inq.close()
        outq.close()


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux's")
def test_a_size_the_system_refuses_leaves_the_pipe_as_it_was(monkeypatch, caplog):
    set_size = fcntl.fcntl

    def refusing(fd, command, *args):
        if command == fcntl.F_SETPIPE_SZ:
            raise PermissionError(1, "Operation not permitted")
        return set_size(fd, command, *args)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    with caplog.at_level("INFO", logger=pool.log.name):
        inq, outq = _queues()
    monkeypatch.undo()
    try:
        assert fcntl.fcntl(inq._writer.fileno(), fcntl.F_GETPIPE_SZ) == 2**16  # Linux's default
    finally:
        inq.close()
        outq.close()
    assert "kept the pool process's pipe at its default size: [Errno 1] Operation not permitted" in caplog.text


def test_the_size_asked_for_is_what_the_system_lets_a_process_ask_for(monkeypatch, tmp_path):
    limit = tmp_path / "pipe-max-size"
    limit.write_text("65536\n")
    monkeypatch.setattr(pool, "PIPE_MAX_SIZE", limit)
    assert pool.pipe_bytes() == 65536
    monkeypatch.setattr(pool, "PIPE_MAX_SIZE", tmp_path / "absent")
    assert pool.pipe_bytes() == pool.PIPE_BYTES
