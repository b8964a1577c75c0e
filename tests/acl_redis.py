"""A redis-server of the test's own with the users `up` and `enroll` make: no default
user, the centre's user, node users added by the test. Never the shared broker; with
`as_up`, started by `up`'s own command line (append-only), to be stopped or killed and
started again."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gpufleet.core import broker_acl, launch
from tests.conftest import missing_service

STREAM = "gpufleet:ingest"
CENTRE_PASSWORD = "centre-password-for-tests"


class AclRedis:
    """A redis-server on a unix socket in a folder of its own, with an aclfile (no default
    user, the centre's user), as `up` starts it; or, not `with_aclfile`, with the centre's
    user in its configuration only (ACL SAVE then has nowhere to write)."""

    def __init__(self, folder: Path, with_aclfile: bool = True, as_up: bool = False):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            missing_service("redis-server is not installed (apt-get install redis-server)")
        self.folder = folder
        self.socket = folder / "redis.sock"
        self.aclfile = folder / "users.acl"
        line = broker_acl.aclfile_line(broker_acl.CENTRE_USER, CENTRE_PASSWORD, broker_acl.centre_rules())
        if with_aclfile:
            broker_acl.write_aclfile(self.aclfile, [line], [broker_acl.CENTRE_USER])
            self.users = ["--aclfile", str(self.aclfile)]
        else:
            self.users = ["--user", *line.split()[1:], "--user", "default", "reset", *broker_acl.default_rules()]
        self.command = launch.redis_server(self.binary, self.socket, self.aclfile) if as_up else [
            self.binary, "--port", "0", "--unixsocket", str(self.socket), "--unixsocketperm", "700",
            "--save", "", "--appendonly", "no", "--dir", str(self.folder), *self.users]
        self.log = folder / "redis.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                self.centre().ping()
                return
            except redis.RedisError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def client(self, username: str | None, password: str | None) -> redis.Redis:
        # No retries: a refused login is the answer, not a reason to try again.
        return redis.Redis(unix_socket_path=str(self.socket), username=username, password=password,
                           socket_timeout=5, retry=Retry(NoBackoff(), 0))

    def centre(self) -> redis.Redis:
        return self.client(broker_acl.CENTRE_USER, CENTRE_PASSWORD)

    def url(self, username: str = broker_acl.CENTRE_USER, password: str = CENTRE_PASSWORD) -> str:
        """The broker URL (kombu's form) of this server for `username`."""
        return f"redis+socket://{username}:{password}@{self.socket}"


def running(with_aclfile: bool = True, as_up: bool = False) -> Iterator[AclRedis]:
    """A started AclRedis in a folder of its own, stopped and removed afterwards (a test's
    fixture yields from it)."""
    # Short: a unix socket's path may not be longer than 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="gf-acl-", dir="/tmp"))
    server = AclRedis(folder, with_aclfile, as_up)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
