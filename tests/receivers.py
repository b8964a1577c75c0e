"""Real receivers on loopback, each on its own port: an SMTP server (aiosmtpd) that
apprise's mailto:// reaches, and an HTTP server that takes a json:// or form:// webhook.
A plugin of tests/conftest.py: the alert tests and the browser journeys share them."""

from __future__ import annotations

import json
import socket
import threading
import time
from email import message_from_bytes
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl

import pytest
from aiosmtpd.controller import Controller

# A password and a token that must never be shown, logged or audited.
WEBHOOK_PASSWORD = "s3cret-Passw0rd"
WEBHOOK_TOKEN = "tok-5f2a9c81d7"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Inbox:
    """What the SMTP server received: each message parsed."""

    def __init__(self):
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(message_from_bytes(envelope.content, policy=email_policy))
        return "250 OK"

    def subjects(self) -> list[str]:
        return [str(m["Subject"]) for m in self.messages]

    def text(self, index: int) -> str:
        return self.messages[index].get_body(("plain",)).get_content()


@pytest.fixture
def inbox():
    box = Inbox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    box.url = f"mailto://127.0.0.1:{port}?from=gpufleet@example.com&to=ops@example.com&mode=insecure"
    yield box
    controller.stop()


class Webhook:
    """What the HTTP server received: each JSON body and its Authorization header, and
    the status it answered each with (`answered`). It answers `status` (200 by default)
    after `delay` seconds."""

    def __init__(self):
        self.posts: list[dict] = []
        self.answered: list[int] = []
        self.status = 200
        self.delay = 0.0
        self.lock = threading.Lock()

    def titles(self) -> list[str]:
        return [post["title"] for post in self.posts]

    def accepted(self) -> list[dict]:
        """The posts it answered with a success."""
        return [post for post, status in zip(self.posts, self.answered, strict=True) if status < 300]


def _form_value(value: str):
    """A form field as sent: the nested ones (events, labels) are JSON text."""
    return json.loads(value) if value[:1] in "[{" else value


@pytest.fixture
def webhook():
    hook = Webhook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
                body = {key: _form_value(value) for key, value in parse_qsl(raw.decode())}
            else:
                body = json.loads(raw)
            time.sleep(hook.delay)
            with hook.lock:
                hook.posts.append({**body, "path": self.path, "authorization": self.headers.get("Authorization"),
                                   "x-team": self.headers.get("X-Team")})
                hook.answered.append(status := hook.status)
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # A short poll: shutdown() waits for the loop's next look, and every test that uses
    # the receiver pays that wait.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    port = server.server_address[1]
    hook.url = f"json://ops:{WEBHOOK_PASSWORD}@127.0.0.1:{port}/hooks/{WEBHOOK_TOKEN}"
    yield hook
    server.shutdown()
    server.server_close()
