"""The Redis that carries the ingest stream: the broker Celery uses (CELERY_BROKER_URL),
reached with redis-py directly, one client per process."""

from __future__ import annotations

import functools

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from gpufleet.core import agent_settings

# kombu names a Redis on a unix socket redis+socket:///path (or socket://); redis-py unix:///path.
_SOCKET_SCHEMES = ("redis+socket://", "socket://")


def redis_url(broker_url: str) -> str:
    """`broker_url` (kombu's form) as redis-py takes it."""
    for scheme in _SOCKET_SCHEMES:
        if broker_url.startswith(scheme):
            return "unix://" + broker_url.removeprefix(scheme)
    return broker_url


def connect(broker_url: str, timeout: float = 10.0, retries: int = 3) -> redis.Redis:
    """A client of the Redis at `broker_url`. A command that finds the connection lost
    is tried again `retries` times, reconnecting, before the error reaches the caller."""
    return redis.Redis.from_url(
        redis_url(broker_url), socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


@functools.cache
def client() -> redis.Redis:
    """This process's client of the settings' broker (redis-py pools its connections)."""
    settings = agent_settings.current()
    return connect(settings.CELERY_BROKER_URL)


def append(fields: dict[bytes, bytes], to: redis.Redis | None = None) -> bytes:
    """XADD one entry (wire.encode_entry) to the ingest stream, trimming it to about
    GPUFLEET_INGEST_STREAM_MAXLEN entries (XADD says nothing of what it trimmed: the
    centre counts that: stream_status below)."""
    settings = agent_settings.current()
    return (to or client()).xadd(settings.GPUFLEET_INGEST_STREAM, fields,
                                 maxlen=settings.GPUFLEET_INGEST_STREAM_MAXLEN, approximate=True)


def deleted_key(stream: str) -> str:
    """The counter of entries the consumers deleted once stored: with the stream's
    entries-added and length it tells how many its MAXLEN trimmed unstored."""
    return f"{stream}:deleted"


def stream_status(to: redis.Redis, stream: str | None = None) -> tuple[int, int]:
    """The ingest stream's length (entries not stored yet) and how many entries its
    MAXLEN trimmed before they were stored, since the stream was made."""
    settings = agent_settings.current()
    stream = stream or settings.GPUFLEET_INGEST_STREAM
    try:
        info = to.xinfo_stream(stream)
    except redis.ResponseError:  # no such stream yet
        return 0, 0
    deleted = int(to.get(deleted_key(stream)) or 0)
    return info["length"], max(0, info["entries-added"] - info["length"] - deleted)
