"""core.bulk: many rows of a model in a fixed number of statements."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gpufleet.core import bulk
from gpufleet.fleet.models import Device, DeviceSample, Node
from tests.conftest import needs_postgresql
from tests.factories import snapshot

pytestmark = pytest.mark.django_db

FIRST = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_an_upsert_sets_what_the_rows_hold_afterwards_as_the_orm_reads_them():
    """first_seen is not updated, so the row's own comes back; busy_at is kept where the
    new value is None: the stored one comes back, to the microsecond, in UTC."""
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    reported = snapshot("n", gpus=1)["devices"][0]
    stored = Device.from_reported(node, reported, FIRST)
    stored.busy_at = FIRST + timedelta(seconds=1)
    stored.save()
    later = FIRST + timedelta(days=1)
    again = Device.from_reported(node, reported, later)
    assert again.first_seen == later and again.busy_at is None

    bulk.upsert(Device, [again], ["node", "uuid"], Device.UPDATED_ON_INGEST, keep_when_null=["busy_at"],
                returning=["first_seen", "busy_at"])

    assert again.pk == stored.pk
    assert (again.first_seen, again.busy_at) == Device.objects.values_list("first_seen", "busy_at").get(pk=stored.pk)
    assert (again.first_seen, again.busy_at) == (FIRST, FIRST + timedelta(seconds=1))
    assert again.first_seen.utcoffset() == again.busy_at.utcoffset() == timedelta(0)
    assert Device.objects.get(pk=stored.pk).last_seen == later


HEALTH = {"pstate": 'P0 "ünïcode" ✓\\\n', "ratio": 0.1, "big": 2**60, "flag": True, "none": None,
          "nested": [1, "a", {"k": []}]}


def _device_with_health(health) -> Device:
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    device = Device.from_reported(node, snapshot("n", gpus=1)["devices"][0], FIRST)
    device.health = health
    return device


def test_json_values_are_written_as_the_orm_reads_them_back():
    device = _device_with_health(HEALTH)
    bulk.upsert(Device, [device], ["node", "uuid"], Device.UPDATED_ON_INGEST)
    assert Device.objects.get(pk=device.pk).health == HEALTH


def test_a_json_value_no_utf8_can_hold_is_refused_by_the_database_as_before():
    # Validated snapshots hold no lone surrogate; should one come, PostgreSQL refuses
    # it (a DatabaseError, which ingest takes for that snapshot's alone), not the writer.
    needs_postgresql()
    device = _device_with_health({"pstate": "P\ud800"})
    with pytest.raises(DatabaseError), transaction.atomic():
        bulk.upsert(Device, [device], ["node", "uuid"], Device.UPDATED_ON_INGEST)


def test_timestamps_are_written_as_the_instants_they_are_in_any_zone():
    device = _device_with_health({})
    device.save()
    east = timezone(timedelta(hours=2))
    at = [FIRST.astimezone(east), FIRST.astimezone(east), FIRST + timedelta(microseconds=1), FIRST - timedelta(days=400)]
    bulk.insert(DeviceSample, ["device_id", "collected_at"], [(device.pk, t) for t in at])
    assert sorted(DeviceSample.objects.values_list("collected_at", flat=True)) == sorted(at)


def test_an_update_writes_only_the_fields_named_and_reads_no_other():
    Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST, driver_version="550.54")
    node = Node.objects.only("name").get(name="n")
    node.problem, node.gpu_count = "GPU 0 is hot", 3
    with CaptureQueriesContext(connection) as ctx:
        bulk.update(Node, [node], ["problem", "gpu_count"])
    assert not [q for q in ctx.captured_queries if q["sql"].startswith("SELECT")]  # the deferred fields stay unread
    stored = Node.objects.get(name="n")
    assert (stored.problem, stored.gpu_count, stored.driver_version, stored.last_seen) == ("GPU 0 is hot", 3, "550.54", FIRST)
