"""The site hearing nothing: while nodes are enrolled and no snapshot was stored for
GPUFLEET_INGEST_SILENCE_ALERT_S, the central beat opens an ingest-silent event of the
site and /healthz answers 503 with the reason; a stored snapshot ends both. One rule
(gpufleet/fleet/ingest_health.py) decides for both, in a fixed number of statements."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.events import services
from gpufleet.events.models import Event, Kind
from gpufleet.fleet import ingest_health
from gpufleet.fleet import tasks as fleet_tasks
from gpufleet.fleet.models import Node, NodeCredential
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 4, 14, 2, tzinfo=UTC)
REASON = "gpufleet receives no snapshots: check the ingest worker and the broker"


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 60
    settings.GPUFLEET_INGEST_SILENCE_ALERT_S = 300
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 0
    settings.GPUFLEET_EVENT_CLOSE_AFTER_S = 60


def enrol(*names: str, at: datetime = T0 - timedelta(days=1)) -> None:
    NodeCredential.objects.bulk_create([NodeCredential(name=name, issued_at=at) for name in names])


def store(name: str, at: datetime) -> None:
    assert ingest_snapshot(snapshot(name, gpus=1, at=at), now=at).outcome == "accepted"


def beat(at: datetime) -> None:
    with time_machine.travel(at, tick=False):
        fleet_tasks.mark_offline()


def healthz(client, at: datetime):
    with time_machine.travel(at, tick=False):
        return client.get("/healthz")


def silent_events():
    return Event.objects.filter(kind=Kind.INGEST_SILENT)


def test_no_node_enrolled_is_healthy_and_opens_nothing(client):
    # A node row of long ago whose key was revoked since: nothing is expected of it.
    store("gone", T0 - timedelta(days=2))
    enrol("gone")
    NodeCredential.objects.update(revoked_at=T0 - timedelta(days=1))
    answer = healthz(client, T0)
    assert answer.status_code == 200 and answer.content == b"ok"
    beat(T0)
    assert not silent_events().exists()


def test_fresh_snapshots_are_healthy(client):
    enrol("a", "b")
    store("a", T0 - timedelta(hours=1))
    store("b", T0 - timedelta(seconds=299))
    assert healthz(client, T0).status_code == 200
    beat(T0)
    assert not silent_events().exists()


def test_no_snapshot_for_the_silence_time_is_a_503_and_a_site_event_until_one_comes(client):
    enrol("a", "b")
    store("a", T0 - timedelta(hours=1))
    store("b", T0 - timedelta(seconds=300))
    answer = healthz(client, T0)
    assert answer.status_code == 503 and answer["Content-Type"].startswith("text/plain")
    assert answer.content.decode() == f"{REASON}; the last one was stored 2026-05-04 13:57 UTC"
    beat(T0)
    event = silent_events().get()
    assert (event.node_id, event.severity, event.opened_at, event.closed_at) == (None, "fail", T0, None)
    assert event.message == f"{REASON}; the last one was stored 2026-05-04 13:57 UTC"
    beat(T0 + timedelta(minutes=1))
    assert silent_events().count() == 1  # the same one, still open

    back = T0 + timedelta(minutes=2)
    store("b", back)
    assert healthz(client, back).content == b"ok"
    beat(back)
    event.refresh_from_db()
    assert event.clear_since == back and event.closed_at is None  # GPUFLEET_EVENT_CLOSE_AFTER_S not yet over
    store("b", back + timedelta(seconds=60))
    beat(back + timedelta(seconds=60))
    event.refresh_from_db()
    assert event.closed_at == back


def test_a_site_that_never_stored_a_snapshot_is_silent_from_its_first_enrolment(client):
    enrol("a", at=T0)
    enrol("b", at=T0 + timedelta(minutes=3))
    assert healthz(client, T0 + timedelta(seconds=299)).status_code == 200
    answer = healthz(client, T0 + timedelta(seconds=300))
    assert answer.status_code == 503 and answer.content.decode() == f"{REASON}; none was stored since the first node was enrolled, 2026-05-04 14:02 UTC"


def test_a_node_enrolled_after_a_long_silence_waits_its_own_silence_time(client):
    # Every node was revoked for days; one enrolled now is not yet expected to have reported.
    store("old", T0 - timedelta(days=3))
    enrol("new", at=T0)
    assert healthz(client, T0 + timedelta(seconds=60)).status_code == 200
    assert healthz(client, T0 + timedelta(seconds=300)).status_code == 503


@pytest.mark.parametrize("fresh", [True, False])
def test_the_rule_reads_a_fixed_number_of_statements_whatever_the_fleet_size(fresh):
    counts = []
    for size in (1, 40):
        Node.objects.all().delete()
        NodeCredential.objects.all().delete()
        at = T0 - timedelta(seconds=10 if fresh else 900)
        Node.objects.bulk_create([Node(name=f"n{i}", last_seen=at) for i in range(size)])
        enrol(*(f"n{i}" for i in range(size)))
        with CaptureQueriesContext(connection) as ctx:
            silence = ingest_health.ingest_silence(T0)
        assert (silence is None) is fresh
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1] <= 3
    if fresh:
        assert counts == [1, 1]  # the usual answer: one look for a recent snapshot


def test_healthz_needs_no_login_and_reads_a_fixed_number_of_queries(client, django_assert_max_num_queries):
    enrol(*(f"n{i}" for i in range(30)))
    Node.objects.bulk_create([Node(name=f"n{i}", last_seen=T0 - timedelta(hours=1)) for i in range(30)])
    with django_assert_max_num_queries(3):
        assert healthz(client, T0).status_code == 503
    Node.objects.filter(name="n7").update(last_seen=T0)
    with django_assert_max_num_queries(1):
        assert healthz(client, T0).status_code == 200


def test_the_event_closes_through_the_close_job_too():
    enrol("a")
    store("a", T0 - timedelta(hours=1))
    beat(T0)
    store("a", T0 + timedelta(minutes=1))
    beat(T0 + timedelta(minutes=1))
    services.close_cleared(T0 + timedelta(minutes=2))
    assert silent_events().get().closed_at == T0 + timedelta(minutes=1)
