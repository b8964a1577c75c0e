"""core.bulk: many rows of a model in a fixed number of statements."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from gpufleet.core import bulk
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node

pytestmark = pytest.mark.django_db

FIRST = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


FIELDS = ["node_id", "uuid", "index", "name", "pci_bus_id", "health", "last_seen", "first_seen", "busy_at"]


def _row(node: Node, seen, busy_at=None, health=None) -> tuple:
    return (node.pk, "GPU-0", 0, "NVIDIA H200", "", {} if health is None else health, seen, seen, busy_at)


def _upsert(rows: list[tuple], **kwargs) -> dict:
    return bulk.upsert(Device, FIELDS, rows, ["node", "uuid"], ["index", "name", "health", "last_seen", "busy_at"],
                       **kwargs)


def test_an_upsert_returns_what_the_rows_hold_afterwards_as_the_orm_reads_them():
    """first_seen is not updated, so the row's own comes back; busy_at is kept where the
    new value is None: the stored one comes back, to the microsecond, in UTC."""
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    first = _upsert([_row(node, FIRST, busy_at=FIRST + timedelta(seconds=1))])
    later = FIRST + timedelta(days=1)

    again = _upsert([_row(node, later)], keep_when_null=["busy_at"], returning=["first_seen", "busy_at"])

    ((pk,),) = first.values()
    assert list(again) == [(node.pk, "GPU-0")]
    assert again[node.pk, "GPU-0"] == (pk, FIRST, FIRST + timedelta(seconds=1))
    assert again[node.pk, "GPU-0"][1:] == Device.objects.values_list("first_seen", "busy_at").get(pk=pk)
    _, first_seen, busy_at = again[node.pk, "GPU-0"]
    assert first_seen.utcoffset() == busy_at.utcoffset() == timedelta(0)
    assert Device.objects.get(pk=pk).last_seen == later


def test_an_upsert_inserts_and_updates_in_one_call_and_keys_each_row_by_its_unique_fields():
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    ((old,),) = _upsert([_row(node, FIRST)]).values()
    new = (node.pk, "GPU-1", 1, "NVIDIA H100", "", {}, FIRST, FIRST, None)
    written = _upsert([new, _row(node, FIRST + timedelta(seconds=1))], returning=["name"])
    assert written[node.pk, "GPU-0"] == (old, "NVIDIA H200")
    assert written[node.pk, "GPU-1"] == (Device.objects.get(uuid="GPU-1").pk, "NVIDIA H100")
    assert Device.objects.count() == 2


HEALTH = {"pstate": 'P0 "ünïcode" ✓\\\n', "ratio": 0.1, "big": 2**60, "flag": True, "none": None,
          "nested": [1, "a", {"k": []}]}


def test_json_values_are_written_as_the_orm_reads_them_back():
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    ((pk,),) = _upsert([_row(node, FIRST, health=HEALTH)]).values()
    assert Device.objects.get(pk=pk).health == HEALTH


@pytest.mark.postgresql
def test_a_json_value_no_utf8_can_hold_is_refused_by_the_database_as_before():
    # Validated snapshots hold no lone surrogate; should one come, PostgreSQL refuses
    # it (a DatabaseError, which ingest takes for that snapshot's alone), not the writer.
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    with pytest.raises(DatabaseError), transaction.atomic():
        _upsert([_row(node, FIRST, health={"pstate": "P\ud800"})])


def test_timestamps_are_written_as_the_instants_they_are_in_any_zone():
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    device = Device.objects.create(node=node, uuid="GPU-0", index=0, name="NVIDIA H200")
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


FINDING = ["node_id", "position", "code", "name", "status", "message", "fix"]


@pytest.mark.postgresql
def test_rows_no_utf8_can_hold_are_refused_as_the_database_refuses_them():
    """Validation keeps lone surrogates out of findings; were one to get past it, the
    COPY's refusal is a DatabaseError, which ingest handles by storing the batch's
    snapshots one by one."""
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    with pytest.raises(DatabaseError), transaction.atomic():
        bulk.insert(Finding, FINDING, [(node.pk, 0, "check", "A check", "ok", "bad \ud800", "")])


def test_rows_are_read_as_values_list_reads_them():
    """JSON decoded, timestamps the same instants in UTC, None kept; the ordering dropped."""
    node = Node.objects.create(name="n", first_seen=FIRST, last_seen=FIRST)
    _upsert([_row(node, FIRST, busy_at=FIRST + timedelta(microseconds=1), health=HEALTH),
             (node.pk, "GPU-1", 1, "NVIDIA H200", "", {}, FIRST, FIRST, None)])
    fields = ["id", "node_id", "uuid", "health", "last_seen", "busy_at"]
    devices = Device.objects.filter(node=node).order_by("-index")
    read = bulk.rows(devices, fields)
    assert sorted(read) == sorted(devices.values_list(*fields))
    assert {row[2]: row[3] for row in read} == {"GPU-0": HEALTH, "GPU-1": {}}
    assert {row[4].utcoffset() for row in read} == {timedelta(0)}
