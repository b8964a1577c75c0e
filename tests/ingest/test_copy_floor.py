"""The bench's ingest floor (gpufleet/tools/floors.py) leaves the rows ingest leaves: the
bench compares ingest with the same rows written the cheapest way, so the floor must
not write less (or other) than ingest does."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.tools import simulation
from gpufleet.tools.floors import CopyFloor

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
# Stamped with each write's own `now`, which the two writes do not share.
WRITE_TIMES = {"id", "node_id", "last_seen", "vanished_at"}


def _snapshots(trouble: str, tick: int, at: datetime) -> tuple[dict, dict]:
    """The same snapshot as node `ingested` and as node `floored`."""
    node = simulation.SimulatedNode("ingested", simulation.MODELS[0], trouble, seed=11)
    snapshot = simulation.snapshot(node, at, tick)
    return snapshot, {**snapshot, "node": "floored"}


def _rows(name: str) -> dict:
    node = Node.objects.get(name=name)
    devices = Device.objects.filter(node=node).order_by("uuid")
    return {
        "node": {f.attname: getattr(node, f.attname) for f in Node._meta.concrete_fields
                 if f.attname not in {"id", "name", "first_seen", "last_seen"}},
        "devices": [{f.attname: getattr(d, f.attname) for f in Device._meta.concrete_fields
                     if f.attname not in WRITE_TIMES} | {"vanished": d.vanished_at is not None} for d in devices],
        "samples": list(DeviceSample.objects.filter(device__node=node).order_by("device__uuid", "collected_at")
                        .values_list("device__uuid", "collected_at", *DeviceSample.MEASURES)),
        "findings": list(Finding.objects.filter(node=node).order_by("position")
                         .values_list("position", "code", "name", "status", "message", "fix")),
    }


@pytest.mark.parametrize("trouble", ["", "vram", "hot", "ecc"])
def test_the_floor_writes_what_ingest_writes(trouble):
    first = _snapshots(trouble, 0, T0)
    for snapshot in first:
        assert ingest_snapshot(snapshot).outcome == "accepted"
    ingested, floored = _snapshots(trouble, 1, T0 + timedelta(seconds=30))
    assert ingest_snapshot(ingested).outcome == "accepted"
    assert CopyFloor().store([floored]) == 1
    assert _rows("floored") == _rows("ingested")
    assert len(_rows("floored")["samples"]) == 2 * len(ingested["devices"])


def test_the_floor_marks_a_gpu_no_longer_reported_vanished():
    for snapshot in _snapshots("", 0, T0):
        ingest_snapshot(snapshot)
    _, floored = _snapshots("", 1, T0 + timedelta(seconds=30))
    CopyFloor().store([{**floored, "devices": floored["devices"][1:]}])
    vanished = Device.objects.filter(node__name="floored", vanished_at__isnull=False)
    assert [d.uuid for d in vanished] == [floored["devices"][0]["uuid"]]
