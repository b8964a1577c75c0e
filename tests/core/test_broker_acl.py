"""Broker rights per node (gpufleet/core/broker_acl.py) against a real redis-server the
test starts on a unix socket of its own, with the users `up` and `enroll` make: node B,
logged in with its own user, is refused everything that would read, delete, consume or
watch what belongs to node A or the centre; it may append to the ingest stream only
through the centre's function, only entries of the wire's fields and bounds, and use its
own queue's keys; it runs no Lua of its own; its old password stops working when it is
rotated."""

from __future__ import annotations

import os
from pathlib import Path

import kombu
import pytest
import redis
from redis.lock import Lock

from gpufleet import wire
from gpufleet.core import agent_settings, broker, broker_acl
from gpufleet.fleet import broker_users
from tests.acl_redis import CENTRE_PASSWORD, STREAM, running


@pytest.fixture
def acl_redis(settings):
    settings.GPUFLEET_INGEST_STREAM = STREAM
    yield from running()


def _keys(node: str) -> dict[str, str]:
    prefix = broker_acl.node_key_prefix(node)
    return {"queue": f"{prefix}node.{node}", "unacked": f"{prefix}unacked", "index": f"{prefix}unacked_index",
            "binding": f"{prefix}_kombu.binding.node.{node}", "mutex": f"{prefix}unacked_mutex"}


@pytest.fixture
def fleet(acl_redis):
    """Nodes alpha and bravo enrolled, alpha's queue holding a task, the stream an entry
    and the centre's consumer group, the centre's own queue a message."""
    centre = acl_redis.centre()
    broker_users.prepare(centre)
    for name in ("alpha", "bravo"):
        broker_acl.put_node_user(centre, name, f"pw-{name}", broker.ingest_key())
    a = _keys("alpha")
    centre.lpush(a["queue"], '{"task": "apply_fix"}')
    centre.hset(a["unacked"], "tag", "[]")
    centre.zadd(a["index"], {"tag": 1.0})
    centre.sadd(a["binding"], "node.alpha\x06\x16\x06\x16node.alpha")
    centre.set(a["mutex"], "token")
    centre.xadd(broker.ingest_key(), {"node": "alpha", "body": "secret processes"})
    centre.xgroup_create(broker.ingest_key(), "ingest", id="0")
    centre.lpush("housekeeping", "centre task")
    centre.set("gpufleet:centre:key", "x")
    return acl_redis


def _refused(client: redis.Redis, *command) -> str | None:
    """None when the server refused `command` for lack of rights, else what it answered."""
    connection = client.connection_pool.get_connection()
    try:
        connection.send_command(*command)
        try:
            answer = connection.read_response()
        except redis.ResponseError as exc:
            text = str(exc)
            # Inside a script, Redis says it in words of its own.
            if isinstance(exc, redis.exceptions.NoPermissionError) or "no permissions" in text \
                    or "The user executing the script can't" in text:
                return None
            return f"error, not a refusal: {text}"
        return f"answered {answer!r}"
    finally:
        connection.disconnect()
        client.connection_pool.release(connection)


def _against(node: str, stream: str) -> list[tuple]:
    k = _keys(node)
    return [
        # Read the stream: every node's snapshots.
        ("XRANGE", stream, "-", "+"), ("XREVRANGE", stream, "+", "-"), ("XREAD", "STREAMS", stream, "0"),
        ("XREADGROUP", "GROUP", "ingest", "bravo", "STREAMS", stream, ">"), ("XINFO", "STREAM", stream),
        ("XLEN", stream), ("XPENDING", stream, "ingest"),
        ("XAUTOCLAIM", stream, "ingest", "bravo", "0", "0"), ("XCLAIM", stream, "ingest", "bravo", "0", "0-1"),
        # Drop or trim what others sent.
        ("DEL", stream), ("UNLINK", stream), ("XTRIM", stream, "MAXLEN", "0"), ("XDEL", stream, "0-1"),
        ("XACK", stream, "ingest", "0-1"), ("XGROUP", "DESTROY", stream, "ingest"),
        ("XGROUP", "SETID", stream, "ingest", "$"), ("RENAME", stream, k["queue"]),
        # Append by its own XADD, of any size or fields, to the stream by its name.
        ("XADD", STREAM, "*", "node", node), ("XADD", k["queue"], "*", "node", node),
        # Node alpha's queue and kombu's keys for it.
        ("LRANGE", k["queue"], "0", "-1"), ("LINDEX", k["queue"], "0"), ("LLEN", k["queue"]),
        ("BRPOP", k["queue"], "1"), ("RPOP", k["queue"]), ("LMOVE", k["queue"], _keys("bravo")["queue"], "RIGHT", "LEFT"),
        ("LPUSH", k["queue"], "forged task"), ("DEL", k["queue"]), ("UNLINK", k["queue"]),
        ("HGETALL", k["unacked"]), ("HGET", k["unacked"], "tag"), ("HDEL", k["unacked"], "tag"),
        ("ZRANGE", k["index"], "0", "-1"), ("SMEMBERS", k["binding"]), ("GET", k["mutex"]),
        ("DUMP", k["queue"]), ("COPY", k["queue"], _keys("bravo")["queue"]),
        ("SET", k["mutex"], "mine"), ("EXISTS", k["queue"]), ("TYPE", k["queue"]),
        # The centre's keys.
        ("LRANGE", "housekeeping", "0", "-1"), ("BRPOP", "housekeeping", "1"), ("DEL", "housekeeping"),
        ("GET", "gpufleet:centre:key"),
        # The whole server.
        ("KEYS", "*"), ("SCAN", "0"), ("RANDOMKEY",), ("DBSIZE",), ("MONITOR",), ("CONFIG", "GET", "*"),
        ("CONFIG", "SET", "appendonly", "no"), ("FLUSHALL",), ("FLUSHDB",), ("SWAPDB", "0", "1"), ("INFO",),
        ("OBJECT", "ENCODING", "housekeeping"), ("CLIENT", "LIST"), ("CLIENT", "KILL", "USER", "node:alpha"), ("SLOWLOG", "GET"),
        ("PUBLISH", "channel", "x"), ("SUBSCRIBE", "channel"), ("PSUBSCRIBE", "*"), ("SSUBSCRIBE", "channel"),
        ("ACL", "LIST"), ("ACL", "SETUSER", "node:bravo", "+@all"), ("ACL", "GETUSER", "node:alpha"),
        ("ACL", "LOG"), ("ACL", "SAVE"), ("EVAL", "return 1", "0"), ("SCRIPT", "FLUSH"),
        ("SCRIPT", "LOAD", "while true do end"), ("EVAL_RO", "return 1", "0"), ("FCALL_RO", "x", "0"),
        ("FUNCTION", "LIST"), ("FUNCTION", "DUMP"), ("FUNCTION", "LOAD", "#!lua name=x\nreturn 1"),
        ("FUNCTION", "DELETE", broker.append_function(STREAM)), ("FUNCTION", "FLUSH"),
        ("WAIT", "0", "0"), ("BGSAVE",), ("SHUTDOWN", "NOSAVE"),
    ]


def test_it_refuses_node_b_everything_of_node_a_the_stream_and_the_centre(fleet):
    bravo = fleet.client("node:bravo", "pw-bravo")
    commands = _against("alpha", broker.ingest_key()) + _against("alpha", STREAM)
    answered = {" ".join(map(str, c)): why for c in commands if (why := _refused(bravo, *c))}
    assert answered == {}
    centre = fleet.centre()
    assert centre.llen(_keys("alpha")["queue"]) == 1 and centre.xlen(broker.ingest_key()) == 1
    assert centre.llen("housekeeping") == 1


def test_a_node_runs_only_the_scripts_the_centre_loaded_and_with_its_own_rights(fleet):
    # kombu's lock needs EVALSHA (broker_acl.NODE_COMMANDS), of the script the centre
    # loads (broker_users.prepare); a node loads none of its own (no SCRIPT LOAD, no
    # EVAL: test above), and whatever else the script cache holds runs with the node's
    # own key rights, declared keys or not.
    centre, bravo = fleet.centre(), fleet.client("node:bravo", "pw-bravo")
    alpha = _keys("alpha")
    for script, keys in [("return redis.call('rpop', KEYS[1])", [alpha["queue"]]),
                         ("return redis.call('rpop', ARGV[1])", []),
                         ("return redis.call('lpush', ARGV[1], 'forged task')", []),
                         ("return redis.call('del', 'housekeeping')", []),
                         ("return redis.call('xrange', ARGV[2], '-', '+')", []),
                         ("return redis.call('keys', '*')", []),
                         ("return redis.call('flushall')", [])]:
        sha = centre.script_load(script)
        assert _refused(bravo, "EVALSHA", sha, str(len(keys)), *keys, alpha["queue"], broker.ingest_key()) is None, \
            script
    sha = Lock(bravo, "x").lua_release.sha
    assert _refused(bravo, "EVALSHA", sha, "1", alpha["mutex"], "token") is None
    assert centre.get(alpha["mutex"]) == b"token" and centre.llen("housekeeping") == 1
    # kombu's own use of it, on its own keys: redis-py's lock, released by EVALSHA.
    lock = bravo.lock(_keys("bravo")["mutex"], timeout=10)
    assert lock.acquire(blocking=False)
    lock.release()
    assert not bravo.exists(_keys("bravo")["mutex"])


def test_kombus_sweep_releases_its_lock_with_the_centres_script_and_an_agent_without_it_reconnects(acl_redis):
    # kombu's redelivery sweep as the agent runs it (its options, its user). Redis's script
    # cache is empty after a restart: the release is then refused (no SCRIPT LOAD), as a
    # channel error, which the agent's worker takes as a reason to connect again.
    centre = acl_redis.centre()
    broker_acl.put_node_user(centre, "bravo", "pw-bravo", broker.ingest_key())
    options = {**agent_settings.broker_transport_options(10), "global_keyprefix": broker_acl.node_key_prefix("bravo")}
    mutex = _keys("bravo")["mutex"]
    with kombu.Connection(broker_acl.node_url("bravo", "pw-bravo", acl_redis.url()), transport_options=options) as connection:
        channel = connection.default_channel
        with pytest.raises(connection.channel_errors, match="no permissions to run the 'script|load' command"):
            channel.qos.restore_visible(interval=1)
        assert agent_settings.agent_celery_options(agent_settings.from_environment())["broker_channel_error_retry"]
        broker_users.prepare(centre)  # as a consumer does when it (re)connects
        centre.delete(mutex)  # the refused release left it; it expires in 10 s
        channel.qos.restore_visible(interval=1)
        assert not centre.exists(mutex)


def _entry(node: str = "bravo", body: bytes = b"x") -> dict[bytes, bytes]:
    return wire.signed_entry(wire.NodeKey(1, os.urandom(32)), node, wire.SNAPSHOT, body)


def test_it_lets_node_b_append_to_the_stream_and_use_its_own_queue(fleet):
    bravo = fleet.client("node:bravo", "pw-bravo")
    broker.append(_entry(), bravo)
    assert fleet.centre().xlen(broker.ingest_key()) == 2
    own = _keys("bravo")
    with bravo.pipeline() as pipe:
        pipe.sadd(own["binding"], "b").lpush(own["queue"], "task").llen(own["queue"]).execute()
    assert bravo.brpop([own["queue"]], timeout=1) == (own["queue"].encode(), b"task")
    bravo.hset(own["unacked"], "t", "m")
    bravo.zadd(own["index"], {"t": 1})
    assert bravo.zrange(own["index"], 0, -1) == [b"t"] and bravo.hget(own["unacked"], "t") == b"m"
    bravo.delete(own["unacked"], own["index"])


def test_node_b_cannot_append_an_entry_past_the_bound_or_of_other_fields(fleet):
    bravo, centre = fleet.client("node:bravo", "pw-bravo"), fleet.centre()
    mebibyte = b"x" * 2**20
    function = broker.append_function(STREAM)
    # 64 fields of 1 MiB each (each within Redis's bound of one argument), through the
    # function and by XADD of its own to the stream (by the name it knows: its key holds
    # a token of the centre's signing key, which only the function knows).
    fields = [x for i in range(32) for x in (f"f{i}".encode(), mebibyte)]
    with pytest.raises(redis.ResponseError, match="an entry is five fields"):
        bravo.fcall(function, 0, *fields)
    assert _refused(bravo, "XADD", STREAM, "*", *fields) is None
    assert broker.ingest_key() != broker.stream_key(STREAM, b"any other key")
    entry = _entry()
    wrong = [
        ({**entry, b"body": mebibyte + b"x"}, "the body is over 1048576 bytes"),
        ({**entry, b"node": b"../x"}, "node is not a node name"),
        ({**entry, b"node": b"a" * 201}, "node is not a node name"),
        ({**entry, b"gen": b"0"}, "gen is not a key generation"),
        ({**entry, b"kind": b"other"}, "kind is not an entry kind"),
        ({**entry, b"sig": b"A" * 64}, "sig is not an HMAC-SHA256"),
    ]
    for fields, why in wrong:
        with pytest.raises(redis.ResponseError, match=why):
            broker.append(fields, bravo)
        with pytest.raises(wire.EntryError):  # what the consumers refuse, for the same reason
            wire.read_entry(fields)
    with pytest.raises(redis.ResponseError, match="five fields"):
        bravo.fcall(function, 0, *(entry[name] for name in broker.ENTRY_ORDER), b"extra")
    with pytest.raises(redis.ResponseError, match="takes no keys"):
        bravo.fcall(function, 1, _keys("bravo")["queue"], *(entry[name] for name in broker.ENTRY_ORDER))
    # What the wire allows at its bounds goes in, as its five fields.
    assert set(broker.ENTRY_ORDER) == wire.ENTRY_FIELDS
    edge = {**entry, b"node": b"a-." + b"9" * 197, b"gen": b"999999999", b"kind": b"progress", b"body": mebibyte}
    wire.read_entry(edge)
    broker.append(edge, bravo)
    [(_, last)] = centre.xrevrange(broker.ingest_key(), count=1)
    assert last == edge and centre.xlen(broker.ingest_key()) == 2


def test_the_stream_stays_at_the_centres_maxlen_whatever_a_node_appends(fleet, settings):
    settings.GPUFLEET_INGEST_STREAM_MAXLEN = 1000
    centre, bravo = fleet.centre(), fleet.client("node:bravo", "pw-bravo")
    broker_users.prepare(centre)
    with bravo.pipeline(transaction=False) as pipe:
        for _ in range(3000):
            broker.append(_entry(), pipe)
        pipe.execute()
    # MAXLEN ~: whole nodes of the stream's tree go, so a few entries past it stay.
    assert 1000 <= centre.xlen(broker.ingest_key()) < 1200


def test_rotating_closes_the_old_password_out_and_removing_closes_the_user_out(fleet):
    centre = fleet.centre()
    connected = fleet.client("node:bravo", "pw-bravo").connection_pool.get_connection()
    connected.send_command("PING")
    assert connected.read_response() in (b"PONG", "PONG")
    broker_acl.put_node_user(centre, "bravo", "pw-new", broker.ingest_key())
    # A connection made with the old password (a thief's, say) is closed, not left running.
    with pytest.raises(redis.ConnectionError):
        connected.send_command("PING")
        connected.read_response()
    with pytest.raises(redis.AuthenticationError):
        fleet.client("node:bravo", "pw-bravo").ping()
    new = fleet.client("node:bravo", "pw-new")
    assert new.ping()
    assert broker_acl.node_user_exists(centre, "bravo")
    assert broker_acl.remove_node_user(centre, "bravo")
    assert not broker_acl.node_user_exists(centre, "bravo")
    assert not broker_acl.remove_node_user(centre, "bravo")
    with pytest.raises(redis.AuthenticationError):
        fleet.client("node:bravo", "pw-new").ping()


def test_a_node_name_with_pattern_characters_matches_only_itself(acl_redis):
    centre = acl_redis.centre()
    broker_acl.put_node_user(centre, "a*", "pw", broker.ingest_key())
    centre.lpush(_keys("ab")["queue"], "task")
    star = acl_redis.client("node:a*", "pw")
    assert _refused(star, "LRANGE", _keys("ab")["queue"], "0", "-1") is None
    star.lpush(_keys("a*")["queue"], "own")
    with pytest.raises(ValueError, match="no spaces"):
        broker_acl.node_rules("a b", broker.ingest_key())


def test_the_users_survive_a_restart_through_the_aclfile_and_nobody_is_default(acl_redis):
    centre = acl_redis.centre()
    broker_acl.put_node_user(centre, "alpha", "pw-alpha", broker.ingest_key())
    assert broker_acl.save(centre)
    acl_redis.stop()
    acl_redis.start()
    assert acl_redis.client("node:alpha", "pw-alpha").ping()
    with pytest.raises(redis.RedisError):
        acl_redis.client(None, None).get("x")
    # The default user holds rights (for Redis's replays) but nobody logs in as it.
    for password in ("", "nopass", CENTRE_PASSWORD):
        with pytest.raises(redis.AuthenticationError):
            acl_redis.client("default", password).ping()
    # `up` rewrites the centre's line at each start and keeps the nodes enroll saved.
    acl_redis.stop()
    line = broker_acl.aclfile_line(broker_acl.CENTRE_USER, CENTRE_PASSWORD, broker_acl.centre_rules())
    broker_acl.write_aclfile(acl_redis.aclfile, [line], [broker_acl.CENTRE_USER])
    assert oct(acl_redis.aclfile.stat().st_mode & 0o777) == "0o600"
    acl_redis.start()
    assert acl_redis.client("node:alpha", "pw-alpha").ping()


def test_saving_without_an_aclfile_says_so():
    for server in running(with_aclfile=False):
        centre = server.centre()
        broker_acl.put_node_user(centre, "alpha", "pw-alpha", broker.ingest_key())
        assert broker_acl.save(centre) is False
        assert server.client("node:alpha", "pw-alpha").ping()


def test_the_docs_show_the_rules_as_they_are():
    docs = Path(__file__).resolve().parents[2] / "docs"
    readme = " ".join((docs / "architecture.md").read_text().split() + (docs / "deployment.md").read_text().split())
    assert " ".join(broker_acl.node_rules("NODE", f"{STREAM}:TOKEN")) in readme
    assert " ".join(broker_acl.centre_rules()) in readme
    assert f"user {broker_acl.CENTRE_USER} on >%s {' '.join(broker_acl.centre_rules())}" in readme
    assert f"'user default {' '.join(broker_acl.default_rules())}\\nuser {broker_acl.CENTRE_USER}" in readme
