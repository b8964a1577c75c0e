"""Alert senders as real processes on the test's database, against real receivers on
loopback: two housekeeping workers sending at once deliver each notification once, and
the central beat's worker killed mid-send delivers it once after it is started again."""

from __future__ import annotations

import json
import os
import signal
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Delivery, Rule, Status
from gpufleet.alerts.tasks import send_alerts
from gpufleet.events.models import Event, Kind, Severity
from gpufleet.fleet.models import Node
from tests.integration.workers import celery_worker, database_url_for_workers, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The least GPUFLEET_ALERT_CLAIM_TIMEOUT_S may be (settings.py).
CLAIM_TIMEOUT_S = 10


class GatedWebhook:
    """A JSON webhook on loopback (tests/receivers.py has the plain one): `answered` holds
    the title of each notification it answered (200). With `hold_first` it reads the first
    request and never answers it.
    With `in_pairs` each request waits until a second one is in flight too (two senders
    mid-send at once, `pairs` counts them), and both are answered at the same instant:
    the two senders then race for the next delivery."""

    def __init__(self, hold_first: bool = False, in_pairs: bool = False):
        self.answered: list[str] = []
        self.held = threading.Event()
        self.release = threading.Event()
        self.pairs = 0
        self.requests = 0
        lock = threading.Lock()
        meeting = threading.Barrier(2)
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                title = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["title"]
                with lock:
                    hook.requests += 1
                    number = hook.requests
                if hold_first and number == 1:
                    hook.held.set()
                    hook.release.wait(60)
                    self.close_connection = True
                    return
                if in_pairs and meeting.wait(10) == 0:
                    with lock:
                        hook.pairs += 1
                with lock:
                    hook.answered.append(title)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A read timeout above any hold here, so a held send is still in flight when killed.
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook?rto=60"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gated_webhook():
    """Makes GatedWebhooks (the options of each), closed after the test."""
    hooks = []

    def make(**options) -> GatedWebhook:
        hooks.append(GatedWebhook(**options))
        return hooks[-1]

    yield make
    for hook in hooks:
        hook.close()


def _sender_env(own_redis, tmp_path, **extra) -> dict[str, str]:
    return {"CELERY_BROKER_URL": own_redis.url, "DATABASE_URL": database_url_for_workers(),
            "GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_NODE_NAME": "central", "GPUFLEET_ALERT_GROUP_S": "0",
            "GPUFLEET_ALERT_ALLOW_PRIVATE": "true", **extra}  # the receivers are on loopback


def _rule(*channels: Channel) -> Rule:
    """A rule for failing findings on the test's nodes only (never what the beat's other
    tasks open, such as a node gone offline), sent at once."""
    rule = Rule.objects.create(name="senders", kinds=[Kind.FINDING], min_severity=Severity.FAIL, nodes="senders-*",
                               wait_minutes=0, notify_resolved=False)
    rule.channels.set(channels)
    return rule


def _open_event(node: Node, number: int) -> str:
    """Open a failing finding on `node`; the title of its notification."""
    opened = timezone.now() - timedelta(minutes=1)
    Event.objects.create(kind=Kind.FINDING, severity=Severity.FAIL, node=node, code=f"gpu{number}.xid",
                         name=f"GPU {number} Xid 79", first_seen_at=opened, opened_at=opened, last_seen_at=opened)
    return f"gpufleet: Failing: {node.name} GPU {number} Xid 79"


def test_two_housekeeping_workers_sending_at_once_deliver_each_notification_once(
    own_redis, gated_webhook, inbox, settings, tmp_path
):
    settings.GPUFLEET_ALERT_GROUP_S = 0  # each plan below makes deliveries of their own
    hook = gated_webhook(in_pairs=True)
    _rule(Channel.objects.create(name="email", url=inbox.url, redacted="mailto://…"),
          Channel.objects.create(name="hook", url=hook.url, redacted="json://…"))
    node = Node.objects.create(name="senders-1")
    titles = []
    for number in range(20):
        titles.append(_open_event(node, number))
        services.plan()
    assert Delivery.objects.filter(status=Status.PENDING).count() == 40

    env = _sender_env(own_redis, tmp_path)
    with celery_worker("housekeeping-1", "housekeeping", env) as first, \
         celery_worker("housekeeping-2", "housekeeping", env) as second:
        # What the beat sends every tick; each worker takes one (one task at a time, prefetching one).
        send_alerts.delay()
        send_alerts.delay()
        wait_for(lambda: not Delivery.objects.exclude(status=Status.SENT).exists(), 30,
                 "every delivery to be sent", (first, second))

    assert sorted(hook.answered) == sorted(titles)
    assert sorted(inbox.subjects()) == sorted(titles)
    assert set(Delivery.objects.values_list("status", "tries")) == {(Status.SENT, 1)}
    assert Delivery.objects.count() == 40
    assert hook.pairs == 10  # every webhook notification went while the other worker sent one


def test_a_sender_killed_mid_send_delivers_it_once_after_it_is_started_again(own_redis, gated_webhook, tmp_path):
    hook = gated_webhook(hold_first=True)
    _rule(Channel.objects.create(name="hook", url=hook.url, redacted="json://…"))
    title = _open_event(Node.objects.create(name="senders-1"), 0)
    # The central beat's worker (the housekeeping queue, the beat in it), sending alerts every second.
    env = _sender_env(own_redis, tmp_path, GPUFLEET_ALERT_TICK_S="1", GPUFLEET_ALERT_CLAIM_TIMEOUT_S=str(CLAIM_TIMEOUT_S))
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()

    with celery_worker("beat", "housekeeping", env, beat_file=tmp_path / "first" / "beat") as beat:
        assert hook.held.wait(30), f"the webhook never heard from the sender:\n{beat.output}"
        # The receiver read the notification and has not answered: the sender is inside the send.
        os.killpg(beat.proc.pid, signal.SIGKILL)
        beat.proc.wait()
    stuck = Delivery.objects.get()
    assert (stuck.status, stuck.tries, hook.answered) == (Status.SENDING, 1, [])

    with celery_worker("beat-again", "housekeeping", env, beat_file=tmp_path / "second" / "beat") as again:
        sent = wait_for(lambda: Delivery.objects.filter(status=Status.SENT).first(), CLAIM_TIMEOUT_S + 20,
                        "the delivery to be sent again", (again,))

    assert hook.answered == [title]
    assert (sent.tries, sent.error) == (2, "")
    # Taken again only once its claim was older than the claim timeout.
    assert sent.claimed_at - stuck.claimed_at >= timedelta(seconds=CLAIM_TIMEOUT_S)
