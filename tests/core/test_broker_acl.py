"""Broker rights per node (gpufleet/core/broker_acl.py) against a real redis-server the
test starts on a unix socket of its own, with the users `up` and `enroll` make: node B,
logged in with its own user, is refused everything that would read, delete, consume or
watch what belongs to node A or the centre; it may append to the ingest stream and use
its own queue's keys, and its old password stops working when it is rotated."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.lock import Lock

from gpufleet.core import broker_acl
from tests.acl_redis import CENTRE_PASSWORD, STREAM, running


@pytest.fixture
def acl_redis():
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
    for name in ("alpha", "bravo"):
        broker_acl.put_node_user(centre, name, f"pw-{name}", STREAM)
    a = _keys("alpha")
    centre.lpush(a["queue"], '{"task": "apply_fix"}')
    centre.hset(a["unacked"], "tag", "[]")
    centre.zadd(a["index"], {"tag": 1.0})
    centre.sadd(a["binding"], "node.alpha\x06\x16\x06\x16node.alpha")
    centre.set(a["mutex"], "token")
    centre.xadd(STREAM, {"node": "alpha", "body": "secret processes"})
    centre.xgroup_create(STREAM, "ingest", id="0")
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


def _against(node: str) -> list[tuple]:
    k = _keys(node)
    return [
        # Read the stream: every node's snapshots.
        ("XRANGE", STREAM, "-", "+"), ("XREVRANGE", STREAM, "+", "-"), ("XREAD", "STREAMS", STREAM, "0"),
        ("XREADGROUP", "GROUP", "ingest", "bravo", "STREAMS", STREAM, ">"), ("XINFO", "STREAM", STREAM),
        ("XLEN", STREAM), ("XPENDING", STREAM, "ingest"),
        ("XAUTOCLAIM", STREAM, "ingest", "bravo", "0", "0"), ("XCLAIM", STREAM, "ingest", "bravo", "0", "0-1"),
        # Drop or trim what others sent.
        ("DEL", STREAM), ("UNLINK", STREAM), ("XTRIM", STREAM, "MAXLEN", "0"), ("XDEL", STREAM, "0-1"),
        ("XACK", STREAM, "ingest", "0-1"), ("XGROUP", "DESTROY", STREAM, "ingest"),
        ("XGROUP", "SETID", STREAM, "ingest", "$"), ("RENAME", STREAM, k["queue"]),
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
        ("FUNCTION", "LIST"), ("WAIT", "0", "0"), ("BGSAVE",), ("SHUTDOWN", "NOSAVE"),
    ]


def test_it_refuses_node_b_everything_of_node_a_the_stream_and_the_centre(fleet):
    bravo = fleet.client("node:bravo", "pw-bravo")
    answered = {" ".join(map(str, c)): why for c in _against("alpha") if (why := _refused(bravo, *c))}
    assert answered == {}
    centre = fleet.centre()
    assert centre.llen(_keys("alpha")["queue"]) == 1 and centre.xlen(STREAM) == 1 and centre.llen("housekeeping") == 1


def test_a_script_node_b_loads_runs_with_node_bs_rights_only(fleet):
    # kombu's lock needs EVALSHA and SCRIPT LOAD (broker_acl.NODE_COMMANDS): what a node
    # loads is held to its own key rights, declared keys or not.
    bravo = fleet.client("node:bravo", "pw-bravo")
    alpha = _keys("alpha")
    for script, keys in [("return redis.call('rpop', KEYS[1])", [alpha["queue"]]),
                         ("return redis.call('rpop', ARGV[1])", []),
                         ("return redis.call('lpush', ARGV[1], 'forged task')", []),
                         ("return redis.call('del', 'housekeeping')", []),
                         ("return redis.call('xrange', ARGV[2], '-', '+')", []),
                         ("return redis.call('keys', '*')", []),
                         ("return redis.call('flushall')", [])]:
        sha = bravo.script_load(script)
        assert _refused(bravo, "EVALSHA", sha, str(len(keys)), *keys, alpha["queue"], STREAM) is None, script
    sha = bravo.script_load(Lock.LUA_RELEASE_SCRIPT)
    assert _refused(bravo, "EVALSHA", sha, "1", alpha["mutex"], "token") is None
    assert fleet.centre().get(alpha["mutex"]) == b"token" and fleet.centre().llen("housekeeping") == 1
    bravo.set(_keys("bravo")["mutex"], "token")
    assert bravo.evalsha(sha, 1, _keys("bravo")["mutex"], "token") == 1


def test_it_lets_node_b_append_to_the_stream_and_use_its_own_queue(fleet):
    bravo = fleet.client("node:bravo", "pw-bravo")
    bravo.xadd(STREAM, {"node": "bravo", "body": "x"}, maxlen=1000, approximate=True)
    assert fleet.centre().xlen(STREAM) == 2
    own = _keys("bravo")
    with bravo.pipeline() as pipe:
        pipe.sadd(own["binding"], "b").lpush(own["queue"], "task").llen(own["queue"]).execute()
    assert bravo.brpop([own["queue"]], timeout=1) == (own["queue"].encode(), b"task")
    bravo.hset(own["unacked"], "t", "m")
    bravo.zadd(own["index"], {"t": 1})
    assert bravo.zrange(own["index"], 0, -1) == [b"t"] and bravo.hget(own["unacked"], "t") == b"m"
    bravo.delete(own["unacked"], own["index"])


def test_rotating_closes_the_old_password_out_and_removing_closes_the_user_out(fleet):
    centre = fleet.centre()
    connected = fleet.client("node:bravo", "pw-bravo").connection_pool.get_connection()
    connected.send_command("PING")
    assert connected.read_response() in (b"PONG", "PONG")
    broker_acl.put_node_user(centre, "bravo", "pw-new", STREAM)
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
    broker_acl.put_node_user(centre, "a*", "pw", STREAM)
    centre.lpush(_keys("ab")["queue"], "task")
    star = acl_redis.client("node:a*", "pw")
    assert _refused(star, "LRANGE", _keys("ab")["queue"], "0", "-1") is None
    star.lpush(_keys("a*")["queue"], "own")
    with pytest.raises(ValueError, match="no spaces"):
        broker_acl.node_rules("a b", STREAM)


def test_the_users_survive_a_restart_through_the_aclfile_and_nobody_is_default(acl_redis):
    centre = acl_redis.centre()
    broker_acl.put_node_user(centre, "alpha", "pw-alpha", STREAM)
    assert broker_acl.save(centre)
    acl_redis.stop()
    acl_redis.start()
    assert acl_redis.client("node:alpha", "pw-alpha").ping()
    with pytest.raises(redis.RedisError):
        acl_redis.client(None, None).get("x")
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
        broker_acl.put_node_user(centre, "alpha", "pw-alpha", STREAM)
        assert broker_acl.save(centre) is False
        assert server.client("node:alpha", "pw-alpha").ping()


def test_the_docs_show_the_rules_as_they_are():
    docs = Path(__file__).resolve().parents[2] / "docs"
    readme = " ".join((docs / "architecture.md").read_text().split() + (docs / "deployment.md").read_text().split())
    assert " ".join(broker_acl.node_rules("NODE", STREAM)) in readme
    assert " ".join(broker_acl.centre_rules()) in readme
    assert f"user {broker_acl.CENTRE_USER} on >%s {' '.join(broker_acl.centre_rules())}" in readme
