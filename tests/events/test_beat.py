"""Events written by the central beat and by the actions that change a node: offline
and back, refusals, claims that expire and are released, keys, fixes; and the
retention, on the housekeeping queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings as django_settings
from django.utils import timezone

from gpufleet.claims import tasks as claim_tasks
from gpufleet.claims.models import Claim
from gpufleet.claims.services import delete_claim
from gpufleet.events import services, tasks
from gpufleet.events.models import Event, Kind
from gpufleet.fleet import credentials
from gpufleet.fleet import tasks as fleet_tasks
from gpufleet.fleet.models import Node
from gpufleet.ingest.refusals import count_refusals
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.jobs.models import Job, JobKind, JobStatus
from gpufleet.jobs.services import report_progress
from tests.factories import snapshot

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _interval(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 60
    settings.GPUFLEET_EVENT_OPEN_AFTER_S = 0
    settings.GPUFLEET_EVENT_CLOSE_AFTER_S = 60


def test_a_node_that_stops_reporting_opens_an_offline_event_that_its_return_closes():
    now = timezone.now()
    ingest_snapshot(snapshot("late", gpus=1, at=now - timedelta(seconds=200)), now=now - timedelta(seconds=200))
    fleet_tasks.mark_offline()
    event = Event.objects.get(kind=Kind.OFFLINE)
    assert event.node.name == "late" and event.severity == "fail" and event.closed_at is None
    fleet_tasks.mark_offline()
    assert Event.objects.filter(kind=Kind.OFFLINE).count() == 1  # still the same one
    back = now + timedelta(seconds=5)
    ingest_snapshot(snapshot("late", gpus=1, at=back), now=back)
    event.refresh_from_db()
    assert event.clear_since == back and event.closed_at is None
    services.close_cleared(back + timedelta(seconds=60))
    event.refresh_from_db()
    assert event.closed_at == back


def test_refusals_of_a_node_make_one_event_per_reason_that_counts_them_and_closes_when_they_stop():
    Node.objects.create(name="n")
    now = timezone.now()
    with time_machine.travel(now, tick=False):
        count_refusals({("n", "old-key"): 3, ("nobody", "unknown-node"): 5, ("ghost", "bad-signature"): 1})
    with time_machine.travel(now + timedelta(seconds=60), tick=False):
        count_refusals({("n", "old-key"): 2})
    event = Event.objects.get()
    assert (event.kind, event.code, event.count, event.severity) == (Kind.REJECTED_SNAPSHOT, "old-key", 5, "warn")
    assert event.node.name == "n" and event.closed_at is None
    services.close_cleared(now + timedelta(seconds=150))
    event.refresh_from_db()
    assert event.closed_at is None  # refusals come once an interval: it waits one more
    services.close_cleared(now + timedelta(seconds=181))
    event.refresh_from_db()
    assert event.closed_at == now + timedelta(seconds=60)


def test_an_ended_claim_is_an_event_until_released_and_its_release_is_one(operator, lab):
    node = Node.objects.create(name="n", gpu_count=2)
    claim = Claim.objects.create(node=node, team=lab, name="train", count=1, starts_at=timezone.now() - timedelta(hours=3),
                                 ends_at=timezone.now() - timedelta(hours=1))
    claim_tasks.release_expired()  # GPUFLEET_RELEASE_EXPIRED is off: flagged, not released
    expired = Event.objects.get(kind=Kind.CLAIM_EXPIRED)
    assert expired.claim_name == "train" and expired.closed_at is None and expired.node == node
    assert "ended at" in expired.message and "free for other claims" in expired.message
    delete_claim(claim, operator, expected_updated_at=claim.updated_at)
    released = Event.objects.get(kind=Kind.CLAIM_RELEASED)
    assert released.claim_name == "train" and released.closed_at == released.opened_at
    assert operator.username in released.message
    claim_tasks.release_expired()
    expired.refresh_from_db()
    assert expired.clear_since is not None


def test_a_rotated_and_a_revoked_key_are_events_of_their_node():
    node = Node.objects.create(name="n")
    credentials.enroll("n")
    assert not Event.objects.exists()  # a first enrolment changes nothing of a node
    credentials.enroll("n", rotate=True)
    credentials.revoke("n")
    assert list(Event.objects.order_by("id").values_list("kind", "node", "severity", "name")) == [
        (Kind.KEY_ROTATED, node.pk, "info", "Node key rotated"), (Kind.KEY_REVOKED, node.pk, "warn", "Node key revoked")]
    # A node enrolled before its first snapshot has no row yet: the event is the site's,
    # and its name says whose key it was.
    credentials.enroll("later")
    credentials.enroll("later", rotate=True)
    assert Event.objects.filter(node=None).values_list("name", flat=True).get() == "Key of later rotated"
    credentials.revoke("n")  # already revoked: nothing new
    assert Event.objects.filter(node=node).count() == 2


def test_a_finished_fix_is_an_event_with_its_job():
    node = Node.objects.create(name="n")
    fix = Job.objects.create(node=node, kind=JobKind.FIX, fix_code="cdi")
    diagnose = Job.objects.create(node=node, kind=JobKind.DIAGNOSE)
    report_progress(diagnose.pk, JobStatus.DONE, node="n")
    report_progress(fix.pk, JobStatus.RUNNING, node="n")
    assert not Event.objects.exists()
    report_progress(fix.pk, JobStatus.DONE, output="ok", node="n")
    report_progress(fix.pk, JobStatus.DONE, output="again", node="n")  # a duplicate changes nothing
    event = Event.objects.get()
    assert (event.kind, event.job, event.node, event.severity, event.code) == (Kind.FIX_APPLIED, fix, node, "info", "cdi")


def test_closed_events_past_their_retention_go_and_open_ones_stay(settings):
    settings.GPUFLEET_EVENT_RETENTION_DAYS = 30
    now = timezone.now()
    node = Node.objects.create(name="n")
    for days, closed in [(40, True), (20, True), (400, False)]:
        at = now - timedelta(days=days)
        Event.objects.create(kind=Kind.FINDING, severity="warn", node=node, code=f"c{days}", first_seen_at=at,
                             opened_at=at, last_seen_at=at, closed_at=at if closed else None)
    assert tasks.prune_events() == 1
    assert sorted(Event.objects.values_list("code", flat=True)) == ["c20", "c400"]


def test_the_events_jobs_run_on_the_housekeeping_queue_never_ingest():
    schedule = django_settings.CELERY_BEAT_SCHEDULE
    names = {entry["task"] for entry in schedule.values()}
    assert {"gpufleet.events.tasks.close_cleared", "gpufleet.events.tasks.prune_events"} <= names
    route = django_settings.CELERY_TASK_ROUTES["gpufleet.events.tasks.*"]
    assert route["queue"] == django_settings.HOUSEKEEPING_QUEUE
