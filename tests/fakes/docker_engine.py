"""A small fake Docker Engine API on a unix socket.

Answers GET /_ping, /version and /info (also versioned: /v1.47/info) the way dockerd does,
with a configurable /info body, and counts the requests per path. Failures apply to /info
only, so a test can tell "Docker answered badly" from "Docker is not there":

    with FakeDockerEngine(docker_payload("nvidia-cdi")) as engine:
        EngineDocker(engine.url).info()
        assert engine.info_requests == 1
"""

from __future__ import annotations

import collections
import http.server
import json
import os
import re
import shutil
import socket
import socketserver
import tempfile
import threading
from typing import Any, Self

_VERSIONED = re.compile(r"^/v\d+(?:\.\d+)?(/.*)$")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False
    engine: FakeDockerEngine


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet; and client_address is "" on a unix socket

    def address_string(self) -> str:
        return "unix"

    def _send(
        self, status: int, body: bytes, content_type: str = "application/json"
    ) -> None:
        engine = self.server.engine
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Api-Version", engine.api_version)
        self.send_header("Server", "Docker/fake (linux)")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        engine = self.server.engine
        path = self.path.split("?", 1)[0]
        match = _VERSIONED.match(path)
        endpoint = match.group(1) if match else path
        engine._record(self.command, path, endpoint)
        if endpoint == "/_ping":
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif endpoint == "/version":
            self._json(200, engine.version_payload())
        elif endpoint == "/info":
            if engine.delay > 0 and engine._stopping.wait(engine.delay):
                return
            if engine.body is not None:
                self._send(engine.status, engine.body)
            elif engine.status >= 400:
                self._json(engine.status, {"message": engine.error_message})
            else:
                self._json(engine.status, engine.info)
        elif endpoint == "/containers/json":
            self._json(200, engine.containers)
        elif endpoint.startswith("/containers/") and endpoint.endswith("/json"):
            found = engine.inspected.get(endpoint.split("/")[2])
            if found is None:
                self._json(404, {"message": "No such container"})
            else:
                self._json(200, found)
        else:
            self._json(404, {"message": "page not found"})


class FakeDockerEngine:
    """Fake dockerd API. Attributes may be changed while it runs:

    info     dict served by /info
    delay    seconds /info waits before answering (a slow daemon)
    status   HTTP status of /info (500: an error JSON {"message": error_message})
    body     raw bytes for /info instead of JSON (garbage), sent with `status`
    """

    def __init__(
        self,
        info: dict[str, Any] | None = None,
        *,
        socket_path: str | os.PathLike[str] | None = None,
        delay: float = 0.0,
        status: int = 200,
        body: bytes | None = None,
        error_message: str = "fake daemon error",
        api_version: str = "1.47",
        min_api_version: str = "1.24",
    ):
        self.info: dict[str, Any] = info if info is not None else {}
        # What GET /containers/json answers: the running containers; and what
        # GET /containers/<id>/json answers, by ID (404 for the others).
        self.containers: list[dict[str, Any]] = []
        self.inspected: dict[str, dict[str, Any]] = {}
        self.delay = delay
        self.status = status
        self.body = body
        self.error_message = error_message
        self.api_version = api_version
        self.min_api_version = min_api_version
        self._own_dir: str | None = None
        if socket_path is None or len(os.fsencode(socket_path)) > 100:
            # unix socket paths are limited to ~107 bytes: use a short private dir
            self._own_dir = tempfile.mkdtemp(prefix="fakedocker-")
            socket_path = os.path.join(self._own_dir, "docker.sock")
        self.socket_path = os.fspath(socket_path)
        self._lock = threading.Lock()
        self.requests: collections.Counter[str] = collections.Counter()
        self.endpoints: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, str]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    @property
    def info_requests(self) -> int:
        """How many /info (any /vNN/info too) requests arrived."""
        return self.count("/info")

    def count(self, endpoint: str) -> int:
        """Requests for an unversioned endpoint ("/info", "/version", "/_ping")."""
        with self._lock:
            return self.endpoints[endpoint]

    def _record(self, method: str, path: str, endpoint: str) -> None:
        with self._lock:
            self.requests[path] += 1
            self.endpoints[endpoint] += 1
            self.log.append((method, path))

    def version_payload(self) -> dict[str, Any]:
        return {
            "Platform": {"Name": "Docker Engine - Fake"},
            "Version": str(self.info.get("ServerVersion", "29.7.2")),
            "ApiVersion": self.api_version,
            "MinAPIVersion": self.min_api_version,
            "Os": "linux",
            "Arch": "amd64",
            "KernelVersion": "6.8.0",
        }

    def start(self) -> FakeDockerEngine:
        if self._server is not None:
            return self
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        self._stopping.clear()
        server = _Server(self.socket_path, _Handler)
        server.engine = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="FakeDockerEngine",
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        self._stopping.set()
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def unix_http_get(
    socket_path: str, path: str, timeout: float = 2.0
) -> tuple[int, bytes]:
    """One plain HTTP/1.0 GET over a unix socket (stdlib only): (status, body)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    return int(status_line[1]), body
