"""The fleet's exports through the real web (`manage.py web`, gunicorn as
gpufleet/core/launch.py runs it) to a client that reads slowly, as over a slow link:
each download takes several times the worker timeout, the three at once from one
worker, and each body arrives whole. gunicorn kills a worker that has not checked in
for the timeout; a sync worker cannot check in while it writes a response, so there
a long export was cut off part way."""

from __future__ import annotations

import csv
import http.client
import io
import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.test import Client

from gpufleet.fleet import reports
from gpufleet.ingest.services import ingest_snapshots
from tests.factories import snapshot
from tests.integration.web import Web

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# Enough that each body outlasts the slow reading below by far (the Markdown, the
# smallest, included), whatever the kernel buffers between the two ends.
NODES, GPUS = 500, 8
TIMEOUT_S = 2  # the web's worker timeout here; gthread's worker checks in about once a second
SLOW_S = 3 * TIMEOUT_S
READ_BYTES, PAUSE_S = 512, 0.02  # about 25 kB/s while reading slowly
# The client's end as over a real link (an Ethernet-sized segment, a small window), not
# loopback's 64 kB segments, with which the server's kernel takes megabytes ahead of the
# reader and a body that size is written before any timeout.
SEGMENT, RECEIVE_BUFFER = 1460, 4096


def _fleet() -> list[str]:
    at = datetime.now(UTC)
    names = [f"export-{i:04d}" for i in range(NODES)]
    for start in range(0, NODES, 100):
        results = ingest_snapshots([snapshot(name, GPUS, at=at) for name in names[start:start + 100]])
        assert {r.outcome for r in results} == {"accepted"}
    return names



class _SmallWindow(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, SEGMENT)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        self.sock.settimeout(self.timeout)
        self.sock.connect((self.host, self.port))


def _slow_download(web: Web, path: str, cookie: str) -> tuple[bytes, int, float]:
    """The body of `path`, read a little at a time for SLOW_S, then the rest at once;
    with how much the slow reading got, and the seconds it all took."""
    conn = _SmallWindow("127.0.0.1", web.port, timeout=60)
    body = bytearray()
    try:
        conn.request("GET", path, headers={"Cookie": cookie})
        response = conn.getresponse()
        assert response.status == 200, (path, response.status)
        start = time.monotonic()
        while time.monotonic() - start < SLOW_S and (part := response.read(READ_BYTES)):
            body += part
            time.sleep(PAUSE_S)
        slow = len(body)
        body += response.read()
    except (http.client.IncompleteRead, ConnectionError) as exc:
        got = len(body) + len(getattr(exc, "partial", b""))
        raise AssertionError(f"{path} was cut off after {got} bytes ({exc!r}); the web's log:\n{web.log()}") from None
    finally:
        conn.close()
    return bytes(body), slow, time.monotonic() - start


def test_each_fleet_export_arrives_whole_however_long_the_client_takes(admin_user, tmp_path):
    # One worker: the three downloads at once take a thread each of it.
    web = Web(tmp_path / "web.log", {"GPUFLEET_WEB_TIMEOUT": str(TIMEOUT_S), "GPUFLEET_WEB_THREADS": "4"})
    pool = ThreadPoolExecutor(3)
    try:
        names = _fleet()  # while the web starts
        client = Client()
        client.force_login(admin_user)
        cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
        web.wait_ready()
        downloads = {fmt: pool.submit(_slow_download, web, f"/report.{fmt}", cookie) for fmt in ("csv", "json", "md")}
        bodies = {}
        for fmt, download in downloads.items():
            body, slow, seconds = download.result()
            # The server can be only a little ahead of the reader: with more than as much
            # again still to come after the slow reading, it wrote for longer than that.
            assert len(body) > 2 * slow and seconds >= SLOW_S, (fmt, slow, len(body), seconds)
            bodies[fmt] = body.decode()
    finally:
        web.stop()  # first: a download still running ends with it
        pool.shutdown()

    rows = list(csv.reader(io.StringIO(bodies["csv"])))
    assert tuple(rows[0]) == reports.CSV_COLUMNS
    devices = [row for row in rows[1:] if row[reports.CSV_COLUMNS.index("row")] == "device"]
    assert len(devices) == NODES * GPUS and {row[0] for row in devices} == set(names)

    exported = json.loads(bodies["json"])["nodes"]
    assert [node["node"] for node in exported] == names
    assert all(len(node["devices"]) == GPUS for node in exported)

    headings = re.findall(r"^## (.+): ", bodies["md"], re.MULTILINE)
    assert headings == [reports.md_cell(name) for name in names]
