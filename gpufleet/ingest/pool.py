"""The ingest worker's pool (CELERY_WORKER_POOL): Celery's prefork pool, whose pipe to
each pool process holds most of a batch.

The worker's consumer pickles a batch of messages (about 1.6 MB: 200 snapshots of 8
GPUs) and writes it to the pool process's pipe, which holds 64 KiB: about 25 writes,
each in an event-loop turn of its own, between turns that receive the next messages
from Redis. Between batches the pool process waited 3-12 ms for the next (it stores
one in about 100 ms); with a pipe of 1 MiB, 3-5 ms (two runs each, 2 cores, a backlog
of 500 nodes' snapshots). Celery offers no setting for the size of these pipes, hence
this subclass."""

from __future__ import annotations

import fcntl
import logging
from pathlib import Path

from celery.concurrency import asynpool, prefork

log = logging.getLogger(__name__)

PIPE_BYTES = 2**20
# What an unprivileged process may ask for (Linux); 1 MiB unless an admin changed it.
PIPE_MAX_SIZE = Path("/proc/sys/fs/pipe-max-size")


def pipe_bytes() -> int:
    try:
        return min(PIPE_BYTES, int(PIPE_MAX_SIZE.read_text()))
    except (OSError, ValueError):
        return PIPE_BYTES


def enlarge_pipe(fd: int) -> None:
    """Make the pipe of `fd` hold pipe_bytes(), where the system allows it."""
    set_pipe_size = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if set_pipe_size is None:
        return
    try:
        fcntl.fcntl(fd, set_pipe_size, pipe_bytes())
    except OSError as exc:  # refused: the pool works as Celery's, a little slower
        log.info("kept the pool process's pipe at its default size: %s", exc)


class AsynPool(asynpool.AsynPool):
    def create_process_queues(self):
        inq, outq, synq = super().create_process_queues()
        enlarge_pipe(inq._writer.fileno())
        return inq, outq, synq


class TaskPool(prefork.TaskPool):
    Pool = AsynPool
