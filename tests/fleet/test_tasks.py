"""Central beat jobs: offline marking and the history's housekeeping (the roll-up
and retention themselves are tested in test_history_housekeeping.py)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from gpufleet.core import launch
from gpufleet.fleet import history, tasks
from gpufleet.fleet.models import DeviceSample, Node, NodeRollup5m
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import ingest_entry, snapshot

pytestmark = pytest.mark.django_db


def test_a_node_goes_offline_after_three_missed_intervals(settings):
    settings.GPUFLEET_COLLECT_INTERVAL = 30
    now = timezone.now()
    ingest_snapshot(snapshot("late", gpus=1), now=now - timedelta(seconds=91))
    ingest_snapshot(snapshot("fine", gpus=1), now=now - timedelta(seconds=89))
    assert tasks.mark_offline() == 1
    assert Node.objects.get(name="late").offline is True
    assert Node.objects.get(name="fine").offline is False
    assert Node.objects.get(name="late").status.label == "Offline"
    assert tasks.mark_offline() == 0  # already offline: nothing to do twice


def test_raw_history_older_than_its_retention_is_pruned(settings):
    settings.GPUFLEET_HISTORY_RAW_HOURS = 6
    now = timezone.now()
    # Far enough apart that on PostgreSQL the old one's whole partition is older than 6 h.
    ingest_snapshot(snapshot("n", gpus=2, at=now - timedelta(hours=9)), now=now)
    ingest_snapshot(snapshot("n", gpus=2, at=now - timedelta(hours=1)), now=now)
    assert DeviceSample.objects.count() == 4
    tasks.prune_history()
    assert DeviceSample.objects.count() == 2
    assert DeviceSample.objects.filter(collected_at__lt=now - timedelta(hours=6)).count() == 0


def test_the_roll_up_task_rolls_finished_buckets():
    ingest_snapshot(snapshot("n", gpus=2, at=timezone.now() - timedelta(minutes=20)))
    assert tasks.roll_history()["5m"] == 1  # one row for the node's two GPUs (and an hourly one, when
    assert [len(row.gpus()) for row in NodeRollup5m.objects.all()] == [2]  # those 20 min crossed an hour)


def test_the_beats_work_goes_to_the_housekeeping_queue_never_to_an_ingest_consumer():
    from django.conf import settings

    from gpufleet.celery import app

    def queue(task: str) -> str:
        return app.amqp.router.route({}, task)["queue"].name

    assert {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} >= {
        "gpufleet.fleet.tasks.prune_history", "gpufleet.fleet.tasks.roll_history"}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert queue(entry["task"]) == "housekeeping", entry["task"]
    # Only the beat's own process reads it: the ingest consumer reads only the stream.
    assert "housekeeping" not in launch.ingest()
    assert launch.central_beat(Path("/d"))[launch.central_beat(Path("/d")).index("-Q") + 1] == "housekeeping"


def test_the_central_beat_runs_the_history_housekeeping():
    from django.conf import settings

    from gpufleet.celery import app

    tasks_by_entry = {name: entry["task"] for name, entry in settings.CELERY_BEAT_SCHEDULE.items()}
    assert tasks_by_entry["roll-history"] == "gpufleet.fleet.tasks.roll_history"
    assert tasks_by_entry["prune-history"] == "gpufleet.fleet.tasks.prune_history"
    assert settings.CELERY_BEAT_SCHEDULE["roll-history"]["schedule"] == history.ROLL_EVERY.total_seconds()
    assert {"gpufleet.fleet.tasks.roll_history", "gpufleet.fleet.tasks.prune_history"} <= set(app.tasks)


def test_the_ingest_consumer_finishes_the_job_it_answers(admin_user):
    from gpufleet.jobs.models import Job, JobKind, JobStatus

    ingest_snapshot(snapshot("n", gpus=1))
    job = Job.objects.create(node=Node.objects.get(name="n"), kind=JobKind.DIAGNOSE)
    snap = snapshot("n", gpus=1, at=timezone.now() + timedelta(seconds=1))
    assert ingest_entry(snap, job.pk) == "accepted"
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
