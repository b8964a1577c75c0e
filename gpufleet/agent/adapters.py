"""The host adapters: the domain's `Runner` and `DockerFacts` (gpufleet/gpu/interfaces.py)
on the real host, with subprocesses, the Docker Engine API and the CDI spec folders."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Mapping, Sequence
from urllib.parse import quote, urlsplit

from gpufleet.gpu.interfaces import (
    COMMAND_TIMEOUT_S,
    DEFAULT_CDI_SPEC_DIRS,
    DEFAULT_DOCKER_HOST,
    CommandResult,
    DockerInfo,
    cdi_spec_mentions_gpu,
    docker_info_from_payload,
    is_cdi_spec_name,
)

_REASON_MAX = 200


def _shorten(text: str, limit: int = _REASON_MAX) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _decode(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


# What one command may print per stream before the rest is thrown away unread, so a
# command that floods its output cannot take the agent's memory with it.
OUTPUT_LIMIT = 1024 * 1024


class _CappedReader(threading.Thread):
    """Reads a pipe to its end, keeping the first `limit` bytes."""

    def __init__(self, pipe, limit: int = OUTPUT_LIMIT):
        super().__init__(daemon=True)
        self.pipe, self.limit = pipe, limit
        self.kept = bytearray()
        self.truncated = False

    def run(self) -> None:
        try:
            while chunk := self.pipe.read1(65536):
                room = self.limit - len(self.kept)
                if len(chunk) > room:
                    self.truncated = True
                self.kept += chunk[: max(room, 0)]
        except (OSError, ValueError):
            pass  # the pipe was closed under us after a kill


class SubprocessRunner:
    """Runs host commands directly (never through a shell) with `LC_ALL=C`.

    The command gets its own session, so on timeout the whole process group is killed:
    a hung script whose children still hold stdout cannot block the caller.
    """

    def __init__(self, env: Mapping[str, str] | None = None):
        # env=None: the current os.environ at each run (PATH honoured).
        self._env = env

    def run(
        self, argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S
    ) -> CommandResult:
        args = tuple(str(a) for a in argv)
        if not args:
            return CommandResult(argv=args, exit_code=None, error="empty command")
        name = args[0]
        env = dict(os.environ if self._env is None else self._env)
        env["LC_ALL"] = "C"
        try:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except FileNotFoundError:
            if shutil.which(
                name, path=env.get("PATH")
            ):  # found, but its interpreter is not
                error = f"{name} could not be run: its interpreter was not found"
            else:
                error = f"{name} not found" + ("" if os.sep in name else " on PATH")
            return CommandResult(argv=args, exit_code=None, error=error)
        except PermissionError as exc:
            return CommandResult(
                argv=args,
                exit_code=None,
                error=f"{name} could not be run: {exc.strerror or 'permission denied'}",
            )
        except OSError as exc:
            return CommandResult(
                argv=args,
                exit_code=None,
                error=f"{name} could not be run: {exc.strerror or exc}",
            )

        readers = [_CappedReader(proc.stdout), _CappedReader(proc.stderr)]
        for reader in readers:
            reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc, readers)
            return self._result(args, None, readers, error=f"{name} timed out after {timeout:g} s")
        except BaseException:
            self._kill(proc, readers)
            raise
        for reader in readers:
            reader.join()
        return self._result(args, proc.returncode, readers)

    @staticmethod
    def _result(args, exit_code, readers, error: str = "") -> CommandResult:
        out, err = readers
        return CommandResult(
            argv=args,
            exit_code=exit_code,
            stdout=_decode(bytes(out.kept)),
            stderr=_decode(bytes(err.kept)),
            error=error,
            truncated=out.truncated or err.truncated,
        )

    @staticmethod
    def _kill(proc: subprocess.Popen, readers) -> None:
        """Kill the command's whole process group and let the readers finish."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
        proc.wait()
        # Something outside the group may still hold the pipes: then stop waiting
        # and keep what was read (the daemon readers end when the pipes do).
        for reader in readers:
            reader.join(timeout=2.0)


class EngineError(Exception):
    """The Engine API answered with an HTTP error: `status` and Docker's own message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status} {message}".strip())
        self.status = status


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (dockerd's default endpoint)."""

    def __init__(self, socket_path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def engine_connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """A connection to the Engine at `url`: unix://PATH, or tcp:// and http:// (plain HTTP,
    as the daemon's unencrypted TCP endpoint) and https://."""
    if url.startswith("unix://"):
        return UnixHTTPConnection(url[len("unix://"):], timeout)
    parts = urlsplit(url)
    if parts.scheme in ("tcp", "http") and parts.hostname:
        return http.client.HTTPConnection(parts.hostname, parts.port or 2375, timeout=timeout)
    if parts.scheme == "https" and parts.hostname:
        return http.client.HTTPSConnection(parts.hostname, parts.port or 2376, timeout=timeout)
    raise ValueError(f"unsupported DOCKER_HOST {url!r} (unix://, tcp://, http:// or https://)")


def _docker_reason(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return _shorten(f"the answer is not JSON ({exc.msg} at char {exc.pos})")
    if isinstance(exc, FileNotFoundError):
        return "no socket there (is dockerd running?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is dockerd running?)"
    if isinstance(exc, PermissionError):
        return "permission denied on the socket"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    return _shorten(str(exc) or type(exc).__name__)


# What asking the Engine can raise: no answer, a broken or refused one, an unreadable body.
ENGINE_ERRORS = (OSError, http.client.HTTPException, EngineError, ValueError, TypeError, KeyError)


class EngineDocker:
    """`DockerFacts` from the Docker Engine API (`GET /info`, the containers) over HTTP with
    the standard library; never the CLI. Docker's SDK answered the same three requests with
    more memory than the rest of the collection (docs/agent.md, footprint).

    base_url=None resolves DOCKER_HOST (else unix:///var/run/docker.sock) at each call.
    Unversioned paths: the daemon answers in its own current API version.
    """

    def __init__(self, base_url: str | None = None, timeout: float = 5.0):
        self._base_url = base_url
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self._base_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST

    def get(self, path: str) -> object:
        """The decoded JSON answer to GET `path`; EngineError for an HTTP error."""
        conn = engine_connection(self.url, self.timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        if response.status >= 400:
            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = body[:200].decode("utf-8", errors="replace")
            raise EngineError(response.status, str(message))
        return json.loads(body)

    def info(self) -> DockerInfo:
        url = self.url
        try:
            return docker_info_from_payload(self.get("/info"))
        except ENGINE_ERRORS as exc:
            return DockerInfo(error=f"Docker at {url} is unreachable: {_docker_reason(exc, self.timeout)}", url=url)

    def containers(self) -> object:
        try:
            return self.get("/containers/json")  # one request per collection
        except ENGINE_ERRORS:
            # info() reports an unreachable Docker; processes then show without containers.
            return []

    def inspect(self, container_ids: Sequence[str]) -> dict[str, object]:
        found: dict[str, object] = {}
        for cid in container_ids:
            try:
                found[cid] = self.get(f"/containers/{quote(cid, safe='')}/json")
            except EngineError as exc:
                if exc.status != 404:  # 404: gone meanwhile
                    return found
            except ENGINE_ERRORS:
                # Unreachable or too slow (info() says so): stop asking, so a hung Docker
                # costs one timeout per collection, not one per container.
                return found
        return found


CDI_SPEC_READ_LIMIT = 1024 * 1024


def parse_spec_dirs(value: str | None) -> list[str]:
    """GPUFLEET_CDI_SPEC_DIRS: colon-separated; unset or blank means the default dirs."""
    parts = [p.strip() for p in (value or "").split(":")]
    dirs = [p for p in parts if p]
    if not dirs:
        return list(DEFAULT_CDI_SPEC_DIRS)
    unique: list[str] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _mentions_nvidia(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(CDI_SPEC_READ_LIMIT)
    except OSError:
        return False
    return cdi_spec_mentions_gpu(head.decode("utf-8", errors="ignore"))


def list_cdi_spec_files(dirs: Sequence[str]) -> list[str]:
    """NVIDIA CDI spec files in `dirs`: regular files ending .yaml/.yml/.json whose content
    mentions nvidia.com/gpu. Each file counts once even when reached twice (a dir listed
    twice, /var/run vs /run, a symlink); paths come back as found. Unreadable dirs are skipped."""
    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not is_cdi_spec_name(name):
                continue
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen or not _mentions_nvidia(path):
                continue
            seen.add(key)
            found.append(path)
    return found


def proc_cgroup_reader(proc_root: str = "/proc"):
    """`cgroup_of(pid)` for the domain: the text of <proc_root>/<pid>/cgroup, None when the
    process has ended or may not be looked at."""

    def cgroup_of(pid: int) -> str | None:
        try:
            with open(os.path.join(proc_root, str(pid), "cgroup"), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except OSError:
            return None

    return cgroup_of
