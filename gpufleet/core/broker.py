"""The Redis that carries the ingest stream: the broker Celery uses (CELERY_BROKER_URL),
reached with redis-py directly, one client per process.

Agents append through a Redis function the centre loads (FCALL, `append_library`), never
with XADD of their own: Redis bounds each argument of a command (proto-max-bulk-len), not
how many a command has, so a node's own XADD could make one entry of any size and any
fields. Redis holds a function to the caller's ACL rights, so a node still needs XADD on
the stream's key; that key is the stream's name and a token derived from the centre's
signing key (`stream_key`), which only the centre and the function know: a node cannot
name the key for an XADD of its own."""

from __future__ import annotations

import functools
import hashlib
import hmac

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


# An entry's fields in the order the append function takes them (wire.ENTRY_FIELDS).
ENTRY_ORDER = (b"node", b"gen", b"kind", b"sig", b"body")


def append_function(stream: str) -> str:
    """The name of the function (and of its library) through which agents append to
    `stream`: one per stream name, so that streams sharing a Redis keep apart."""
    return "gpufleet_append_" + hashlib.sha256(stream.encode()).hexdigest()[:16]


def stream_key(stream: str, secret: bytes) -> str:
    """The key in Redis of the stream named `stream`: the name and a token of `secret`
    (the centre's GPUFLEET_SIGNING_KEY), which a node never learns."""
    token = hmac.new(secret, b"gpufleet ingest stream\0" + stream.encode(), hashlib.sha256).hexdigest()[:32]
    return f"{stream}:{token}"


def ingest_key(stream: str | None = None) -> str:
    """The centre's only (the agent has no signing key): the key of the ingest stream
    (GPUFLEET_INGEST_STREAM unless `stream` names another)."""
    settings = agent_settings.current()
    return stream_key(stream or settings.GPUFLEET_INGEST_STREAM, settings.GPUFLEET_SIGNING_KEY)


def _lua_text(text: str) -> str:
    # A Lua string literal of `text`, every byte but ASCII letters and digits escaped (\ddd).
    return '"' + "".join(chr(b) if chr(b).isalnum() and b < 128 else f"\\{b:03d}" for b in text.encode()) + '"'


def append_library(stream: str, key: str, maxlen: int, body_max: int, kinds: tuple[str, ...]) -> str:
    """The Lua library of `stream`'s append function: it takes an entry's five fields
    (ENTRY_ORDER), refuses any that wire.read_entry would refuse for its shape or size
    (a body over `body_max` bytes), and appends them to `key` as XADD ... MAXLEN ~ `maxlen`."""
    name = append_function(stream)
    kinds_table = ", ".join(f"[{_lua_text(kind)}] = true" for kind in kinds)
    return f"""#!lua name={name}
local KEY, MAXLEN, BODY_MAX = {_lua_text(key)}, {_lua_text(str(maxlen))}, {int(body_max)}
local KINDS = {{{kinds_table}}}

local function entry_error(args)
    if #args ~= 5 then return 'an entry is five fields: node, gen, kind, sig, body' end
    local node, gen, kind, sig, body = unpack(args)
    if #node > 200 or not string.find(node, '^[A-Za-z0-9][A-Za-z0-9._%-]*$') then return 'node is not a node name' end
    if #gen > 9 or not string.find(gen, '^[1-9][0-9]*$') then return 'gen is not a key generation' end
    if not KINDS[kind] then return 'kind is not an entry kind' end
    if #sig ~= 64 or not string.find(sig, '^[0-9a-f]*$') then return 'sig is not an HMAC-SHA256 in hex' end
    if #body > BODY_MAX then return 'the body is over ' .. BODY_MAX .. ' bytes' end
end

redis.register_function('{name}', function(keys, args)
    local wrong = 'the append takes no keys'
    if #keys == 0 then wrong = entry_error(args) end
    if wrong then return redis.error_reply('ERR gpufleet entry refused: ' .. wrong) end
    return redis.call('XADD', KEY, 'MAXLEN', '~', MAXLEN, '*', 'node', args[1], 'gen', args[2],
                      'kind', args[3], 'sig', args[4], 'body', args[5])
end)
"""


def load_library(to: redis.Redis, library: str) -> None:
    """Load (or replace) a function library (append_library): the centre's to do, as it
    starts; Redis keeps it in its data (append-only file, RDB) across restarts."""
    to.function_load(library, replace=True)


def append(fields: dict[bytes, bytes], to: redis.Redis | None = None) -> bytes:
    """Append one entry (wire.encode_entry) to the ingest stream through its function,
    which trims the stream to about the centre's GPUFLEET_INGEST_STREAM_MAXLEN entries
    (what it trimmed goes unsaid: the centre counts it, stream_status below)."""
    settings = agent_settings.current()
    return (to or client()).fcall(append_function(settings.GPUFLEET_INGEST_STREAM), 0,
                                  *(fields[name] for name in ENTRY_ORDER))


def deleted_key(key: str) -> str:
    """The counter of entries the consumers deleted once stored from the stream at `key`:
    with the stream's entries-added and length it tells how many its MAXLEN trimmed unstored."""
    return f"{key}:deleted"


def _reported_key(key: str) -> str:
    # How many of the stream's trims a consumer has reported (new_trims).
    return f"{key}:trims-reported"


# Acknowledges a consumer's entries, deletes them and counts those deleted (deleted_key) in
# one atomic step: a consumer killed between the deleting and the counting would leave them
# counted as trimmed. ARGV: the group, then the ids (a few at a time: Lua's unpack is bounded).
_ACK_AND_DELETE = """
local deleted = 0
for i = 2, #ARGV, 1000 do
    local last = math.min(i + 999, #ARGV)
    redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, i, last))
    deleted = deleted + redis.call('XDEL', KEYS[1], unpack(ARGV, i, last))
end
if deleted > 0 then redis.call('INCRBY', KEYS[2], deleted) end
return deleted
"""

# Raises the count of reported trims (KEYS[1]) to ARGV[1] when that is more; answers by how
# much. A stream made anew (KEYS[2] gone) starts its count again.
_REPORT = """
if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('DEL', KEYS[1])
    return 0
end
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local now = tonumber(ARGV[1])
if now <= before then return 0 end
redis.call('SET', KEYS[1], now)
return now - before
"""


def ack_and_delete(to: redis.Redis, key: str, group: str, ids: list[bytes]) -> int:
    """Acknowledge `ids` in `group` and delete them from the stream at `key`, counting them
    as stored (deleted_key), all at once; how many were still in the stream."""
    return int(to.register_script(_ACK_AND_DELETE)(keys=[key, deleted_key(key)], args=[group, *ids]))


def stream_status(to: redis.Redis, stream: str | None = None) -> tuple[int, int]:
    """The ingest stream's length (entries not stored yet) and how many entries its
    MAXLEN trimmed before they were stored, since the stream was made (the centre's:
    ingest_key)."""
    key = ingest_key(stream)
    # Read together: an acknowledgement between the two reads would look like a trim.
    with to.pipeline(transaction=True) as pipe:
        pipe.xinfo_stream(key).get(deleted_key(key))
        try:
            info, deleted = pipe.execute()
        except redis.ResponseError:  # no such stream yet
            return 0, 0
    return info["length"], max(0, info["entries-added"] - info["length"] - int(deleted or 0))


def new_trims(to: redis.Redis, stream: str | None = None) -> int:
    """How many entries the ingest stream's MAXLEN trimmed unstored that no consumer has
    reported yet (stream_status), now counted as reported: each trim is told once, by
    whichever consumer asks first, also one started after it."""
    key = ingest_key(stream)
    trimmed = stream_status(to, stream)[1]
    return int(to.register_script(_REPORT)(keys=[_reported_key(key), key], args=[trimmed]))
