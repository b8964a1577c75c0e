"""Central beat jobs: offline marking and history pruning."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.fleet import tasks
from gpufleet.fleet.models import DeviceSample, Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.ingest.tasks import ingest as ingest_task
from tests.factories import snapshot

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


def test_history_older_than_the_retention_is_pruned(settings):
    settings.GPUFLEET_HISTORY_RETENTION_HOURS = 24
    now = timezone.now()
    ingest_snapshot(snapshot("n", gpus=2, at=now - timedelta(hours=25)), now=now)
    ingest_snapshot(snapshot("n", gpus=2, at=now - timedelta(hours=1)), now=now)
    assert DeviceSample.objects.count() == 4
    assert tasks.prune_history() == 2
    assert DeviceSample.objects.filter(collected_at__lt=now - timedelta(hours=24)).count() == 0


def test_the_ingest_task_finishes_the_job_it_answers(admin_user):
    from gpufleet.jobs.models import Job, JobKind, JobStatus

    ingest_snapshot(snapshot("n", gpus=1))
    job = Job.objects.create(node=Node.objects.get(name="n"), kind=JobKind.DIAGNOSE)
    snap = snapshot("n", gpus=1, at=timezone.now() + timedelta(seconds=1))
    assert ingest_task(snap, job.pk) == "accepted"
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
