"""One list of what a GPU is: the fields of the domain's gpu.Device (gpu.DEVICE_FIELDS).
The wire schema (ingest/schema.py DeviceIn), the stored row (fleet Device: its columns,
the rest in `health`) and the exports (JSON, CSV) follow it, derived from it where they
can be and checked against it here where they cannot (pydantic's types and limits, the
model's columns). A field added to one of them and not to the others fails here."""

from __future__ import annotations

import copy
import json
from dataclasses import MISSING, fields

import pytest
from django.db import models
from pydantic import ValidationError

from gpufleet import gpu, wire
from gpufleet.fleet import reports
from gpufleet.fleet.models import Device, Node
from gpufleet.ingest import schema
from gpufleet.ingest.services import ACCEPTED, ingest_snapshot
from tests.factories import snapshot

UUID = "GPU-5f1c2d3e-0000-4a4a-8b8b-0123456789ab"
# A GPU with every field set, none to its default, in to_dict's form.
EVERY_FIELD = {
    "index": 0, "uuid": UUID, "name": "NVIDIA H200", "vram_total_mib": 143771, "vram_used_mib": 30211,
    "utilization_percent": 87, "pci_bus_id": "00000000:9B:00.0", "temperature_c": 71, "memory_temperature_c": 80,
    "power_draw_w": 612.5, "power_limit_w": 700.0, "fan_percent": 30, "pstate": "P0", "sm_clock_mhz": 1755,
    "sm_clock_max_mhz": 1980, "persistence_mode": True, "ecc_mode": True, "ecc_corrected_volatile": 3,
    "ecc_uncorrected_volatile": 1, "ecc_uncorrected_aggregate": 2, "retired_pages_pending": True,
    "remapped_rows_correctable": 4, "remapped_rows_uncorrectable": 5, "remapped_rows_pending": True,
    "remapped_rows_failure": False, "throttle_reasons": ["sw_power_cap", "hw_slowdown"], "mig_mode": True,
    "pcie_link_gen": 4, "pcie_link_gen_max": 5, "pcie_link_width": 16, "pcie_link_width_max": 16,
    "power_draw_average_w": 598.25, "sw_power_cap_us": 1200, "sw_thermal_slowdown_us": 30,
    "hw_thermal_slowdown_us": 2, "hw_power_brake_slowdown_us": 1, "sync_boost_us": 7,
    "mig_devices": [{"uuid": "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "profile": "3g.40gb", "device": 0}],
    "xid_errors": [{"xid": 119, "count": 2, "last_seen": "2026-12-03T16:05:10+00:00",
                    "description": "GSP RPC timeout"}],
    "processes": [{"pid": 4412, "name": "python3", "used_mib": 30211,
                   "container": {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1",
                                 "claim": "train-llm"}}],
    "attached_idle": [{"id": "9e8d7c6b5a49", "name": "idle", "image": "nvidia/cuda:12.6", "claim": None}],
    "nvlink": [{"link": 0, "state": "up", "replay_errors": 12, "recovery_errors": 1, "crc_errors": 40}],
}


def _snapshot(**device) -> str:
    snap = snapshot("alpha", 1)
    snap["devices"] = [{**EVERY_FIELD, **device}]
    return wire.encode_snapshot(snap)


def _may_be_none(field) -> bool:
    return "None" in str(field.type)  # the annotations are text (from __future__ import annotations)


def test_the_sample_sets_every_field_of_the_domain_s_gpu():
    assert list(EVERY_FIELD) == list(gpu.DEVICE_FIELDS)
    device = gpu.Device.from_dict(EVERY_FIELD)
    assert [f.name for f in fields(gpu.Device) if f.default is not MISSING and getattr(device, f.name) == f.default] == []
    assert device.to_dict() == EVERY_FIELD


def test_the_wire_schema_has_the_domain_s_fields_required_where_the_domain_requires_them():
    assert list(schema.DeviceIn.model_fields) == list(gpu.DEVICE_FIELDS)
    required = [name for name, field in schema.DeviceIn.model_fields.items() if field.is_required()]
    assert required == [f.name for f in fields(gpu.Device) if f.default is MISSING]


def test_the_wire_bounds_each_list_of_the_domain_s_gpu():
    assert [key for key, *_ in wire.DEVICE_LISTS] == list(gpu.NESTED_DEVICE_FIELDS)


def test_every_field_crosses_the_wire_as_the_domain_has_it():
    reported = schema.parse_snapshot(_snapshot()).devices[0]
    assert reported.as_dict() == reported.model_dump() == EVERY_FIELD
    assert gpu.Device.from_dict(reported.as_dict()).to_dict() == EVERY_FIELD


@pytest.mark.parametrize("field", fields(gpu.Device), ids=lambda f: f.name)
def test_the_wire_takes_an_unknown_value_where_the_domain_does(field):
    text = _snapshot(**{field.name: None})
    if _may_be_none(field):
        assert getattr(schema.parse_snapshot(text).devices[0], field.name) is None
    else:
        with pytest.raises((ValidationError, wire.SnapshotError)):
            schema.parse_snapshot(text)


def test_the_row_s_columns_are_fields_of_the_domain_and_unknown_where_it_may_be():
    domain = {f.name: f for f in fields(gpu.Device)}
    assert set(Device.NOT_HEALTH) == {*Device.COLUMNS, "pci_bus_id"} and set(Device.NOT_HEALTH) <= set(domain)
    for name in Device.COLUMNS:
        assert Device._meta.get_field(name).null == _may_be_none(domain[name]), name
    # The row keeps an unknown PCI address as "" (reported() gives None back).
    assert not Device._meta.get_field("pci_bus_id").null


def _more_than_it_holds(column: models.Field):
    if isinstance(column, models.CharField):
        return "x" * (column.max_length + 1)
    if isinstance(column, models.BigIntegerField):
        return 2**63
    if isinstance(column, models.IntegerField):
        return 2**31
    return None  # a float column holds every finite number


@pytest.mark.parametrize("name", sorted(Device.NOT_HEALTH))
def test_the_wire_refuses_a_gpu_figure_its_column_cannot_hold(name):
    if (value := _more_than_it_holds(Device._meta.get_field(name))) is not None:
        with pytest.raises(wire.SnapshotError):
            schema.parse_snapshot(_snapshot(**{name: value}))


@pytest.mark.parametrize("key,column", [("node", "name"), ("driver_version", "driver_version"),
                                        ("toolkit_version", "toolkit_version")])
def test_the_wire_refuses_a_node_text_its_column_cannot_hold(key, column):
    snap = snapshot("alpha", 1)
    snap[key] = _more_than_it_holds(Node._meta.get_field(column))
    with pytest.raises(wire.SnapshotError):
        schema.parse_snapshot(wire.encode_snapshot(snap))


@pytest.mark.django_db
def test_every_field_is_stored_and_read_back_by_the_pages_and_the_exports():
    assert ingest_snapshot(_snapshot()).outcome == ACCEPTED
    row = Device.objects.get(node__name="alpha")
    assert row.as_gpu_device().to_dict() == EVERY_FIELD
    _, exported = reports._chunk_contents([row.node_id], only_problems=False, with_devices=True)
    assert exported == {row.node_id: [EVERY_FIELD]}


def test_the_csv_has_a_column_for_every_field_but_those_it_leaves_out():
    assert set(reports.NOT_DEVICE_CSV_COLUMNS) == {"name", "attached_idle"}
    assert sorted(reports.DEVICE_CSV_COLUMNS) == sorted(set(gpu.DEVICE_FIELDS) - set(reports.NOT_DEVICE_CSV_COLUMNS))
    lists = {c for c in reports.DEVICE_CSV_COLUMNS if isinstance(EVERY_FIELD[c], list)}
    assert set(reports.LIST_CELLS) == lists
    row = reports._device_row("alpha", EVERY_FIELD)
    assert row[:7] == ["alpha", "gpu0", "NVIDIA H200", "", "", "", "device"]
    assert dict(zip(reports.DEVICE_CSV_COLUMNS, row[7:], strict=True)) == {
        **{c: EVERY_FIELD[c] for c in reports.DEVICE_CSV_COLUMNS},
        "persistence_mode": "true", "ecc_mode": "true", "retired_pages_pending": "true",
        "remapped_rows_pending": "true", "remapped_rows_failure": "false", "mig_mode": "true",
        "throttle_reasons": "sw_power_cap hw_slowdown", "xid_errors": "119x2", "processes": 1,
        "mig_devices": "3g.40gb:MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "nvlink": "0:up",
    }


# GPUs as older agents sent them (and as their rows still hold them): only the fields
# they knew, records without their later keys.
OLDER_GPUS = [
    {"index": 0, "uuid": UUID, "name": "NVIDIA A100", "vram_total_mib": None, "vram_used_mib": None,
     "utilization_percent": None},
    {"index": 1, "uuid": UUID, "name": "NVIDIA A100", "vram_total_mib": 81920, "vram_used_mib": 10,
     "utilization_percent": 3, "pci_bus_id": None, "throttle_reasons": None, "temperature_c": 40,
     "processes": [{"pid": 7, "name": "python3"},
                   {"pid": 8, "name": "x", "used_mib": 5, "container": {"id": "c", "name": "n", "image": "i"}}],
     "attached_idle": [{"id": "c2", "name": "n2", "image": "i2"}]},
    {"throttle_reasons": ["hw_slowdown"], "mig_devices": [{"device": 1, "profile": "1g.10gb", "uuid": "MIG-x"}],
     "xid_errors": [{"description": "d", "last_seen": None, "count": 1, "xid": 79}],
     "name": "NVIDIA H100", "uuid": UUID, "index": 2, "utilization_percent": 0, "vram_used_mib": 0,
     "vram_total_mib": 1},
    EVERY_FIELD,
]


@pytest.mark.parametrize("data", OLDER_GPUS, ids=range(len(OLDER_GPUS)))
def test_a_stored_gpu_reads_as_the_domain_s_gpu_without_building_one(data):
    """The exports fill in what an older agent did not send by gpu.device_dict, not by
    a Device per GPU: it must give what the full conversion gives, key order included."""
    before = copy.deepcopy(data)
    assert json.dumps(gpu.device_dict(data)) == json.dumps(gpu.Device.from_dict(data).to_dict())
    assert data == before


def _without_uuid() -> dict:
    return {key: value for key, value in EVERY_FIELD.items() if key != "uuid"}


@pytest.mark.parametrize("data,error", [({**EVERY_FIELD, "bogus": 1}, ValueError), (_without_uuid(), TypeError)])
def test_a_stored_gpu_is_refused_where_the_domain_refuses_it(data, error):
    with pytest.raises(error):
        gpu.Device.from_dict(data)
    with pytest.raises(error):
        gpu.device_dict(data)
