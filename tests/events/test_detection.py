"""Events written at ingest: a warn or fail finding opens an event per node and code (so
per GPU), worsens it, and closes it once it stayed clear; flapping is damped both ways;
the statements a batch costs do not grow with its size."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet.events.models import Event, Kind
from gpufleet.ingest.services import ACCEPTED, ingest_snapshots
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 4, 14, 2, tzinfo=UTC)


def hot(node: str, at: datetime, status: str = "warn", message: str = "Running hot at 87 °C", gpus: int = 4,
        code: str = "gpu3.thermal") -> dict:
    data = snapshot(node, gpus=gpus, at=at)
    data["devices"][3]["pci_bus_id"] = "00000000:9B:00.0"
    data["findings"].append({"code": code, "name": f"GPU 3 ({node})", "status": status, "message": message})
    return data


def store(*datas: dict, at: datetime) -> None:
    with time_machine.travel(at, tick=False):
        assert {r.outcome for r in ingest_snapshots(list(datas))} == {ACCEPTED}


@pytest.fixture(autouse=True)
def _interval(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 60
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 0
    settings.GPUFLEET_EVENT_CLOSE_AFTER_S = 60


def test_a_warn_finding_opens_an_event_for_its_gpu_at_once():
    store(hot("n", T0), at=T0)
    event = Event.objects.get()
    assert (event.kind, event.code, event.severity, event.gpu_index) == (Kind.FINDING, "gpu3.thermal", "warn", 3)
    assert event.pci_bus_id == "00000000:9B:00.0"  # the GPU's address, from its snapshot
    assert event.opened_at == T0 and event.closed_at is None and event.node.name == "n"
    assert event.message_opened == event.message == "Running hot at 87 °C"


def test_it_worsens_keeping_the_message_it_opened_with():
    store(hot("n", T0), at=T0)
    store(hot("n", T0 + timedelta(seconds=60), "fail", "Hardware slowdown at 95 °C"), at=T0 + timedelta(seconds=60))
    event = Event.objects.get()
    assert event.severity == "fail" and event.worsened_at == T0 + timedelta(seconds=60)
    assert event.message == "Hardware slowdown at 95 °C" and event.message_opened == "Running hot at 87 °C"
    # Better again: still the worst it reached, with the latest words.
    store(hot("n", T0 + timedelta(seconds=120), "warn", "Running hot at 86 °C"), at=T0 + timedelta(seconds=120))
    event.refresh_from_db()
    assert event.severity == "fail" and event.message == "Running hot at 86 °C"


def test_it_closes_when_clear_for_the_close_time_at_the_time_it_cleared():
    store(hot("n", T0), at=T0)
    cleared = T0 + timedelta(seconds=35 * 60)
    store(snapshot("n", gpus=4, at=cleared), at=cleared)
    event = Event.objects.get()
    assert event.closed_at is None and event.clear_since == cleared  # clear, not yet for long enough
    store(snapshot("n", gpus=4, at=cleared + timedelta(seconds=60)), at=cleared + timedelta(seconds=60))
    event.refresh_from_db()
    assert event.closed_at == cleared and event.duration == timedelta(minutes=35)


def test_a_condition_back_within_the_close_time_continues_the_same_event():
    store(hot("n", T0), at=T0)
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=60)), at=T0 + timedelta(seconds=60))
    store(hot("n", T0 + timedelta(seconds=90)), at=T0 + timedelta(seconds=90))
    event = Event.objects.get()
    assert event.closed_at is None and event.clear_since is None and event.count == 2
    # Back after it closed: a new event.
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=120)), at=T0 + timedelta(seconds=120))
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=180)), at=T0 + timedelta(seconds=180))
    store(hot("n", T0 + timedelta(seconds=240)), at=T0 + timedelta(seconds=240))
    assert Event.objects.filter(closed_at__isnull=True).count() == 1 and Event.objects.count() == 2


def test_an_event_opens_only_once_its_condition_held_for_the_open_time(settings):
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 120
    store(hot("n", T0), at=T0)
    store(hot("n", T0 + timedelta(seconds=60)), at=T0 + timedelta(seconds=60))
    assert Event.objects.get().opened_at is None  # pending: shown nowhere
    store(hot("n", T0 + timedelta(seconds=120)), at=T0 + timedelta(seconds=120))
    assert Event.objects.get().opened_at == T0  # from when the condition began


def test_a_flap_shorter_than_the_open_time_leaves_nothing(settings):
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 120
    store(hot("n", T0), at=T0)
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=60)), at=T0 + timedelta(seconds=60))
    assert not Event.objects.exists()


def test_ok_findings_make_no_events():
    store(snapshot("n", gpus=4, at=T0), at=T0)
    assert not Event.objects.exists()


def test_a_vanished_gpu_is_an_event_until_it_returns():
    store(snapshot("n", gpus=4, at=T0), at=T0)
    store(snapshot("n", gpus=3, at=T0 + timedelta(seconds=60)), at=T0 + timedelta(seconds=60))
    vanished = Event.objects.get(kind=Kind.GPU_VANISHED)
    assert vanished.gpu_index == 3 and vanished.severity == "fail" and vanished.closed_at is None
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=120)), at=T0 + timedelta(seconds=120))
    store(snapshot("n", gpus=4, at=T0 + timedelta(seconds=180)), at=T0 + timedelta(seconds=180))
    vanished.refresh_from_db()
    assert vanished.closed_at == T0 + timedelta(seconds=120)


def test_detection_off_writes_no_events(settings):
    settings.GPUFLEET_EVENTS_AT_INGEST = False
    store(hot("n", T0), at=T0)
    assert not Event.objects.exists()


def _event_statements(batch: list[dict], at: datetime) -> int:
    with time_machine.travel(at, tick=False), CaptureQueriesContext(connection) as ctx:
        assert {r.outcome for r in ingest_snapshots(batch)} == {ACCEPTED}
    return len([q for q in ctx.captured_queries if '"events_event"' in q["sql"] or "bulk_set_events_event" in q["sql"]])


def test_the_statements_events_cost_a_batch_do_not_grow_with_its_size():
    """Batches of 1 and of 50 nodes whose events open, worsen, repeat, clear and close:
    one read a batch, and one write where anything changed (an insert to open, an
    update to worsen, clear or close: on PostgreSQL a COPY to a staging table and one
    UPDATE from it, four statements), whatever the batch's size."""
    steps = [
        hot,                                               # open
        lambda name, at: hot(name, at, "fail", "worse"),   # worsen
        lambda name, at: hot(name, at, "fail", "worse"),   # repeat: nothing to write
        lambda name, at: snapshot(name, gpus=4, at=at),    # clear
        lambda name, at: snapshot(name, gpus=4, at=at),    # close
    ]
    counts = {}
    for size in (1, 50):
        names = [f"s{size}-{i}" for i in range(size)]
        counts[size] = [
            _event_statements([make(name, T0 + timedelta(seconds=60 * step)) for name in names],
                              T0 + timedelta(seconds=60 * step))
            for step, make in enumerate(steps)
        ]
    update = 4 if connection.vendor == "postgresql" else 1
    assert counts[1] == counts[50] == [2, 1 + update, 1, 1 + update, 1 + update]
    assert Event.objects.filter(closed_at__isnull=False).count() == 51


def test_the_site_has_one_open_event_per_condition_as_a_node_does():
    # Two beats at once must not open the site's ingest-silent event twice: a NULL node
    # is distinct from another in the per-node constraint, so the site has one of its own.
    from django.db import IntegrityError, transaction

    from gpufleet.events.services import Condition, observe

    silent = Condition(None, Kind.INGEST_SILENT, "", "fail", "No snapshots", "none for 6 min")
    observe([Kind.INGEST_SILENT], None, [silent], T0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Event.objects.create(kind=Kind.INGEST_SILENT, severity="fail", first_seen_at=T0, opened_at=T0,
                             last_seen_at=T0)
    observe([Kind.INGEST_SILENT], None, [silent], T0 + timedelta(seconds=5))
    assert Event.objects.filter(kind=Kind.INGEST_SILENT, closed_at__isnull=True).count() == 1


@pytest.mark.postgresql
def test_on_postgresql_a_batch_rewrites_its_open_events_in_place():
    """The events table keeps half of each page empty (fillfactor 50, migration
    events/0001), so an open event that each snapshot rewrites (new words, when last
    seen) gets its new row version beside the old one (a HOT update) rather than new
    entries in each of the table's indexes."""
    names = [f"n{i}" for i in range(80)]  # events enough to fill pages
    store(*(hot(name, T0, message="Running hot at 87 °C") for name in names), at=T0)
    later = T0 + timedelta(seconds=60)
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'events_event'")
        assert cursor.fetchone() == (["fillfactor=50"],)
        # This transaction's own counts (the test runs in one, which earlier work may share).
        counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'events_event'"
        cursor.execute(counts)
        before = cursor.fetchone()
        store(*(hot(name, later, message="Running hot at 88 °C") for name in names), at=later)
        cursor.execute(counts)
        updated, in_place = (after - earlier for after, earlier in zip(cursor.fetchone(), before, strict=True))
    assert updated == len(names) and in_place == updated
