"""A node's user on the broker, made and changed by `manage.py enroll` over the centre's
own connection (the rules are gpufleet/core/broker_acl.py's). Its password is printed
once, in the agent's broker URL, and kept nowhere on the central side. And what only the
centre may load into the broker for the nodes: the function they append through, the
Lua script kombu's lock releases with (`prepare`)."""

from __future__ import annotations

import logging
import secrets

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.lock import Lock
from redis.retry import Retry

from gpufleet import wire
from gpufleet.core import broker, broker_acl

BrokerError = redis.RedisError
log = logging.getLogger(__name__)


def _connect() -> redis.Redis:
    # One try, a short wait: the person running enroll is told at once when the broker is away.
    return redis.Redis.from_url(broker.redis_url(settings.CELERY_BROKER_URL), socket_timeout=5,
                                socket_connect_timeout=5, retry=Retry(NoBackoff(), 0))


def agent_broker_url(name: str, password: str, broker_url: str | None = None) -> str:
    """The CELERY_BROKER_URL of `name`'s agent: `broker_url` (by default the centre's own)
    with that node's user and password."""
    return broker_acl.node_url(name, password, broker_url or settings.CELERY_BROKER_URL)


def make(name: str, rotate: bool = False) -> str | None:
    """A new password for `name`'s user, made if it did not exist; with `rotate`, also when it
    did (connections made with the old password are closed). None when the user exists and
    `rotate` is not asked: its password is not kept here, and stays; its rules become
    today's (a release that changed them, a new GPUFLEET_SIGNING_KEY). Saved to the
    broker's aclfile when it has one. BrokerError when the broker cannot be reached or refuses."""
    conn = _connect()
    try:
        prepare(conn)
        if not rotate and broker_acl.node_user_exists(conn, name):
            broker_acl.renew_node_rules(conn, name, broker.ingest_key())
            _save(conn, name)
            return None
        password = secrets.token_urlsafe(32)
        broker_acl.put_node_user(conn, name, password, broker.ingest_key())
        _save(conn, name)
        return password
    finally:
        conn.close()


def prepare(conn: redis.Redis, stream: str | None = None) -> None:
    """Load into the broker what nodes run and may not load themselves: the ingest
    stream's append function (GPUFLEET_INGEST_STREAM unless `stream`; Redis keeps it
    across restarts), and the release script of redis-py's lock, which kombu's redelivery
    sweep takes (a restart of Redis empties its script cache: the consumers load it again
    as they reconnect). Enroll and each ingest consumer run it as they start."""
    stream = stream or settings.GPUFLEET_INGEST_STREAM
    broker.load_library(conn, broker.append_library(stream, broker.ingest_key(stream),
                                                    settings.GPUFLEET_INGEST_STREAM_MAXLEN,
                                                    wire.ENTRY_BODY_MAX, wire.ENTRY_KINDS))
    conn.script_load(Lock.LUA_RELEASE_SCRIPT)


def remove(name: str) -> bool:
    """Remove `name`'s user (its connections are closed); False if it had none."""
    conn = _connect()
    try:
        removed = broker_acl.remove_node_user(conn, name)
        _save(conn, name)
        return removed
    finally:
        conn.close()


def _save(conn: redis.Redis, name: str) -> None:
    if not broker_acl.save(conn):
        log.warning("the broker has no aclfile: the change to %s lasts until Redis restarts (give it an"
                    " aclfile, as the README's production Redis has)", broker_acl.node_user(name))
