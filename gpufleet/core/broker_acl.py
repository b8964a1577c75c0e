"""Who may do what on the broker (Redis ACLs), in one place: the rules of a node's user
and of the centre's, as ACL SETUSER arguments (and aclfile lines), and creating,
rotating and removing a node's user over a connection of the centre's.

A node's user may append to the ingest stream through its function (gpufleet/core/broker.py)
and use the keys of its own task queue (kombu's `global_keyprefix`, node_key_prefix),
nothing else: root on one GPU host can then only lie about that host, never read,
delete or consume what belongs to another node or to the centre. The commands are those
kombu's Redis transport issues for a Celery worker and beat run with --without-gossip
--without-mingle --without-heartbeat and remote control off (read off MONITOR while an
agent ran against such a user)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import redis

from gpufleet.env import local_secret_key, read_private_text

CENTRE_USER = "gpufleet-centre"

# A node's queue, its unacknowledged index and its bindings: everything kombu keeps for it.
_NODE_KEY_PREFIX = "gpufleet:node:{}:"

# What kombu's Redis transport sends for a worker consuming one queue and publishing to
# it (beat), with `global_keyprefix`, and FCALL of the append function. kombu's
# redelivery sweep holds a lock whose release is a Lua script (redis-py's Lock: EVALSHA):
# the centre loads that script (SCRIPT LOAD) as it starts, and a node may run only what
# the centre loaded, never a script of its own (no SCRIPT LOAD, no EVAL), each command
# held to these same key rights (GET and DEL are the lock script's).
NODE_COMMANDS = (
    "ping", "select", "multi", "exec", "discard", "watch", "unwatch",
    "brpop", "rpop", "lpush", "rpush", "llen",
    "sadd", "srem", "smembers",
    "hset", "hget", "hdel",
    "zadd", "zrem", "zrange",
    "set", "get", "del", "exists", "pexpire",
    "evalsha", "fcall",
)

# The centre is trusted (it grants the nodes their rights), but still cannot flush,
# reconfigure, monitor or list every key by accident: only the admin commands enroll needs.
CENTRE_ADMIN_COMMANDS = ("acl|setuser", "acl|deluser", "acl|getuser", "acl|save", "client|kill")

# Special in ACL key patterns (Redis glob-style matching), and what the aclfile splits on.
_GLOB = re.compile(r"([*?\[\]\\])")
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f]")


def node_key_prefix(name: str) -> str:
    """The prefix of every broker key of `name`'s task queue (kombu's `global_keyprefix`)."""
    return _NODE_KEY_PREFIX.format(name)


def node_user(name: str) -> str:
    """The Redis user of `name`'s agent."""
    return f"node:{name}"


def _check(name: str) -> str:
    if not name or _UNSAFE.search(name):
        raise ValueError(f"{name!r} cannot name a broker user (no spaces or control characters)")
    return name


def _escape(text: str) -> str:
    return _GLOB.sub(r"\\\1", text)


def node_rules(name: str, stream_key: str) -> list[str]:
    """The rights of `name`'s user, without its password: its own queue keys, FCALL, and
    XADD to the ingest stream's key (broker.ingest_key, which the node does not know: the
    append function knows it) and nothing else of it (write-only: XADD reads nothing)."""
    own, key = _escape(node_key_prefix(_check(name))), _escape(_check(stream_key))
    return ["resetchannels", "-@all", f"~{own}*", *(f"+{c}" for c in NODE_COMMANDS), f"(%W~{key} +xadd)"]


def centre_rules() -> list[str]:
    """The rights of the centre's user, without its password."""
    return ["~*", "&*", "+@all", "-@dangerous", *(f"+{c}" for c in CENTRE_ADMIN_COMMANDS)]


def default_rules() -> list[str]:
    """The rules of the default user: off, so that nobody logs in as it (it has no password
    either), with the centre's rights, which cover every user's. Redis replays its
    append-only file as the default user, and before the fix of redis/redis#14541 (Debian's
    7.0 has none) EXEC checks each queued command against that user's rights: with none, a
    restart silently drops every transaction of the file (a batch read by a consumer, its
    acknowledgement, a script's writes), logging a CRITICAL line for each command."""
    return ["off", *centre_rules()]


def _setuser(conn: redis.Redis, user: str, password: str, rules: list[str]) -> None:
    # `reset` first, in the same command: the user never holds old and new rights at once.
    conn.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", *rules)


def put_node_user(conn: redis.Redis, name: str, password: str, stream_key: str) -> None:
    """Create `name`'s user, or give it `password` and today's rules in place of what it
    had; connections made with the old password are closed."""
    user = node_user(name)
    _setuser(conn, user, password, node_rules(name, stream_key))
    conn.execute_command("CLIENT", "KILL", "USER", user)


def renew_node_rules(conn: redis.Redis, name: str, stream_key: str) -> None:
    """Give `name`'s existing user today's rules in place of what it had, in one command,
    keeping its password (and its connections: their next command meets the new rules)."""
    conn.execute_command("ACL", "SETUSER", node_user(name), "resetkeys", "clearselectors", *node_rules(name, stream_key))


def node_user_exists(conn: redis.Redis, name: str) -> bool:
    return conn.execute_command("ACL", "GETUSER", node_user(name)) is not None


def remove_node_user(conn: redis.Redis, name: str) -> bool:
    """Remove `name`'s user (Redis closes its connections); False if there was none."""
    return bool(conn.execute_command("ACL", "DELUSER", node_user(name)))


def save(conn: redis.Redis) -> bool:
    """Write the users to the server's aclfile, so they survive a restart; False when the
    server was started without one (its users then live in its configuration)."""
    try:
        conn.execute_command("ACL", "SAVE")
    except redis.ResponseError as exc:
        if "aclfile" in str(exc).lower() or "acl file" in str(exc).lower():
            return False
        raise
    return True


def private_url(socket: Path, password_file: Path, make: bool = False) -> str:
    """The centre's broker URL of `up`'s private Redis on `socket`: as the centre's user with
    the password kept in `password_file` (made first if `make`, readable by this user only),
    or as nobody while there is none."""
    password = local_secret_key(password_file) if make else read_private_text(password_file)
    if not password:
        return f"redis+socket://{socket}"
    return f"redis+socket://{CENTRE_USER}:{quote(password, safe='')}@{socket}"


def node_url(name: str, password: str, broker_url: str) -> str:
    """`broker_url` with `name`'s user and password in place of whoever it named: the
    CELERY_BROKER_URL of that node's agent."""
    parts = urlsplit(broker_url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(node_user(name), safe='')}:{quote(password, safe='')}@{host}"))


def agent_url_file(data_dir: Path, name: str) -> Path:
    """Where `up` leaves the broker URL of its local agent `name` (its own user), which
    `manage.py agent` prefers to CELERY_BROKER_URL (up's children get the centre's)."""
    return data_dir / f"agent-{name}.broker"


def aclfile_line(user: str, password: str, rules: list[str]) -> str:
    """`user` as a line of an aclfile (its password hashed, as ACL SAVE writes it)."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    return " ".join(["user", user, "reset", "on", f"#{digest}", *rules])


def write_aclfile(path: Path, lines: Iterable[str], users: Iterable[str]) -> None:
    """Rewrite `path` with `lines` in place of the lines of `users` (and of the default user's:
    default_rules); the other users it holds (nodes enroll saved) stay."""
    replaced = {"default", *users}
    kept = []
    if path.exists():
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and (line.split() + ["", ""])[1] not in replaced]
    text = "\n".join([" ".join(["user default reset", *default_rules()]), *lines, *kept]) + "\n"
    partial = path.with_name(f".{path.name}.new")
    partial.write_text(text)
    partial.chmod(0o600)
    partial.replace(path)
