"""A node's user on the broker, made and changed by `manage.py enroll` over the centre's
own connection (the rules are gpufleet/core/broker_acl.py's). Its password is printed
once, in the agent's broker URL, and kept nowhere on the central side."""

from __future__ import annotations

import logging
import secrets

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

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
    `rotate` is not asked: its password is not kept here. Saved to the broker's aclfile
    when it has one. BrokerError when the broker cannot be reached or refuses."""
    conn = _connect()
    try:
        if not rotate and broker_acl.node_user_exists(conn, name):
            return None
        password = secrets.token_urlsafe(32)
        broker_acl.put_node_user(conn, name, password, settings.GPUFLEET_INGEST_STREAM)
        _save(conn, name)
        return password
    finally:
        conn.close()


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
