"""Ingest: one snapshot, one transaction, a fixed number of statements."""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpufleet import gpu, wire
from gpufleet.claims.models import Claim
from gpufleet.claims.services import save_claim
from gpufleet.core import bulk
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.fleet.summary import FleetSummary
from gpufleet.ingest import schema
from gpufleet.ingest.services import ACCEPTED, REJECTED, STALE, ingest_snapshot, ingest_snapshots
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db

# Per snapshot of a known node: lock the node (SELECT FOR UPDATE), upsert devices
# (returning their first_seen and busy_at), mark vanished GPUs, insert samples, read
# the lost GPUs, read claims, replace the findings, changed or not (delete + insert),
# add the usage rows, read the node's open events, save the node; plus the transaction's own statements (BEGIN/COMMIT, or a savepoint
# inside a test's transaction). Where the database cannot return them (SQLite), the
# device upsert reads first_seen and busy_at first: one statement more.
STATEMENTS_PER_SNAPSHOT = 11


def _row_counts():
    return (Node.objects.count(), Device.objects.count(), Finding.objects.count(), DeviceSample.objects.count())


def test_it_stores_an_8_gpu_node():
    snap = snapshot("h200", gpus=8, used_mib=130013, util="100")
    assert ingest_snapshot(snap).outcome == ACCEPTED

    node = Node.objects.get(name="h200")
    assert node.gpu_count == 8
    assert node.vram_total_mib == 8 * 143771
    assert node.vram_used_mib == 8 * 130013
    assert node.utilization_mean == 100
    assert node.attach == "legacy"
    assert node.health == "warn"  # 130013/143771 = 90.4 % >= 90
    assert list(node.devices.values_list("index", flat=True)) == list(range(8))
    assert node.devices.get(index=0).uuid == "GPU-a44622e3-2296-6285-0a86-84d0f6c67900"
    codes = list(node.findings.values_list("code", flat=True))
    assert codes[:2] == ["driver", "gpu0"] and {"toolkit", "cdi", "runtime", "attach"} <= set(codes)
    assert DeviceSample.objects.filter(device__node=node).count() == 8


@pytest.mark.parametrize("findings_changed", [False, True])
@pytest.mark.parametrize("gpus", [1, 8, wire.GPUS_PER_NODE_MAX])
def test_it_uses_a_fixed_number_of_statements_whatever_the_gpu_count(gpus, findings_changed):
    first = snapshot("n", gpus=gpus)
    ingest_snapshot(first)
    second = snapshot("n", gpus=gpus, at=later(first))
    if findings_changed:
        second["findings"][0]["message"] += " (changed)"
    Claim.objects.create(node=Node.objects.get(name="n"), name="job", count=1)
    with CaptureQueriesContext(connection) as ctx:
        assert ingest_snapshot(second).outcome == ACCEPTED
    statements = [q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))]
    # SQLite takes at most 999 parameters a statement, so Django splits the device
    # upsert of many GPUs into several; PostgreSQL has no such cap.
    split = connection.ops.bulk_batch_size(Device._meta.concrete_fields[1:], [None] * gpus)
    upserts = -(-gpus // split) if connection.vendor == "sqlite" else 1
    # On PostgreSQL the node update and the GPU upsert each add three statements to
    # their UPDATE or INSERT: make the staging table if missing, empty it, COPY into it.
    # Elsewhere the GPU upsert adds its read of first_seen and busy_at.
    extra = 6 if connection.vendor == "postgresql" else 1
    assert len(statements) == STATEMENTS_PER_SNAPSHOT + upserts - 1 + extra, (
        "\n".join(s[:80] for s in statements))
    assert Device.objects.filter(node__name="n").count() == gpus
    assert Finding.objects.filter(node__name="n", message=second["findings"][0]["message"]).exists()


def _malformed():
    good = snapshot("bad", gpus=2)
    cases = {}

    def case(name, mutate):
        data = copy.deepcopy(good)
        mutate(data)
        cases[name] = data

    case("no schema_version", lambda d: d.pop("schema_version"))
    case("future schema_version", lambda d: d.update(schema_version=99))
    case("unknown key", lambda d: d.update(extra=1))
    case("container without its claim", lambda d: d["devices"][0].update(
        attached_idle=[{"id": "9e8d", "name": "idle", "image": "cuda:12"}]))
    case("index as text", lambda d: d["devices"][0].update(index="0"))
    case("negative memory", lambda d: d["devices"][0].update(vram_used_mib=-1))
    case("utilization over 100", lambda d: d["devices"][0].update(utilization_percent=101))
    case("bad status", lambda d: d["findings"][0].update(status="bad"))
    case("duplicate uuid", lambda d: d["devices"][1].update(uuid=d["devices"][0]["uuid"]))
    case("no findings", lambda d: d.update(findings=[]))
    case("naive timestamp", lambda d: d.update(collected_at="2026-12-01T10:00:00"))
    case("bad node name", lambda d: d.update(node="../etc"))
    case("devices but not present", lambda d: d.update(present=False))
    case("far future", lambda d: d.update(collected_at=(datetime.now(UTC) + timedelta(hours=1)).isoformat()))
    cases["not a dict"] = ["nope"]
    return cases


@pytest.mark.parametrize("name", list(_malformed()))
def test_it_rejects_a_malformed_snapshot_and_writes_nothing(name, caplog):
    data = _malformed()[name]
    before = _row_counts()
    with caplog.at_level(logging.WARNING, logger="gpufleet.ingest.services"):
        result = ingest_snapshot(data)
    assert result.outcome == REJECTED
    assert result.reason
    assert _row_counts() == before
    assert any("rejected snapshot" in r.getMessage() and result.reason in r.getMessage() for r in caplog.records)


def test_it_ignores_a_snapshot_older_than_the_stored_one():
    new = snapshot("n", gpus=2, used_mib=5000)
    old = snapshot("n", gpus=2, used_mib=100, at=later(new, -60))
    assert ingest_snapshot(new).outcome == ACCEPTED
    assert ingest_snapshot(old).outcome == STALE
    assert ingest_snapshot(new).outcome == STALE  # a duplicate delivery changes nothing
    assert Node.objects.get(name="n").vram_used_mib == 2 * 5000
    assert DeviceSample.objects.count() == 2


def test_it_keeps_a_vanished_gpu_visible_and_brings_it_back():
    first = snapshot("n", gpus=4)
    ingest_snapshot(first)
    second = snapshot("n", gpus=3, at=later(first))
    ingest_snapshot(second)
    node = Node.objects.get(name="n")
    assert node.gpu_count == 3
    gone = Device.objects.get(node=node, index=3)
    assert gone.vanished_at is not None
    assert node.devices.filter(vanished_at__isnull=True).count() == 3

    ingest_snapshot(snapshot("n", gpus=4, at=later(second)))
    gone.refresh_from_db()
    assert gone.vanished_at is None


def test_it_flags_claims_on_devices_that_no_longer_exist():
    first = snapshot("n", gpus=4)
    ingest_snapshot(first)
    node = Node.objects.get(name="n")
    uuid3 = node.devices.get(index=3).uuid
    pinned = Claim.objects.create(node=node, name="pinned", device_ids=["3", uuid3.lower()])
    fine = Claim.objects.create(node=node, name="fine", device_ids=["0"])

    ingest_snapshot(snapshot("n", gpus=3, at=later(first)))
    pinned.refresh_from_db()
    fine.refresh_from_db()
    assert pinned.missing_devices == ["3", uuid3.lower()]
    assert fine.missing_devices == []
    assert Node.objects.get(name="n").gpus_reserved == 1  # only GPU 0 still exists to be held


def test_a_claim_holds_the_gpus_of_the_snapshot_that_brings_them_back():
    # The ledger is made from the node as this snapshot reports it, not as the one before did.
    first = snapshot("n", gpus=2)
    ingest_snapshot(first)
    node = Node.objects.get(name="n")
    Claim.objects.create(node=node, name="everything")  # count 0, no devices: every GPU
    gone = snapshot("n", gpus=0, at=later(first))
    ingest_snapshot(gone)
    assert Node.objects.get(name="n").gpus_reserved == 0

    ingest_snapshot(snapshot("n", gpus=2, at=later(gone)))
    assert Node.objects.get(name="n").gpus_reserved == 2


def test_it_replaces_findings_with_the_latest():
    first = snapshot("n", gpus=1, toolkit="1.18.2")
    ingest_snapshot(first)
    ingest_snapshot(snapshot("n", gpus=1, toolkit=None, at=later(first)))
    toolkit = Finding.objects.get(node__name="n", code="toolkit")
    assert toolkit.status == "warn"
    assert Finding.objects.filter(node__name="n", code="toolkit").count() == 1


def test_it_writes_nothing_when_a_step_fails_midway(monkeypatch):
    insert = bulk.insert

    def broken(model, *args, **kwargs):
        if model is Finding:  # the last step but the node's own row
            raise RuntimeError("disk full")
        return insert(model, *args, **kwargs)

    monkeypatch.setattr(bulk, "insert", broken)
    with pytest.raises(RuntimeError):
        ingest_snapshot(snapshot("n", gpus=2))
    assert _row_counts() == (0, 0, 0, 0)


def test_it_brings_an_offline_node_back_online():
    first = snapshot("n", gpus=1)
    ingest_snapshot(first)
    Node.objects.filter(name="n").update(offline=True)
    ingest_snapshot(snapshot("n", gpus=1, at=later(first)))
    assert Node.objects.get(name="n").offline is False


HEALTH = {
    "pci_bus_id": "00000000:9B:00.0", "temperature_c": 71, "memory_temperature_c": 80, "power_draw_w": 612.5,
    "power_limit_w": 700.0, "fan_percent": None, "pstate": "P0", "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980,
    "persistence_mode": True, "ecc_mode": True, "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
    "ecc_uncorrected_aggregate": 0, "retired_pages_pending": False, "remapped_rows_correctable": 1,
    "remapped_rows_uncorrectable": 0, "remapped_rows_pending": False, "remapped_rows_failure": False,
    "throttle_reasons": ["sw_power_cap"], "mig_mode": True,
    "mig_devices": [{"uuid": "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "profile": "3g.40gb", "device": 0}],
    "xid_errors": [{"xid": 119, "count": 2, "last_seen": "2026-12-03T16:05:10+00:00", "description": "GSP RPC timeout"}],
    "processes": [{"pid": 4412, "name": "python3", "used_mib": 30211,
                   "container": {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1",
                                 "claim": "train-llm"}}],
}


def test_it_stores_every_health_field_and_gives_them_back_as_reported():
    snap = snapshot("alpha", 2)
    snap["devices"][1].update(HEALTH)
    assert ingest_snapshot(snap).outcome == ACCEPTED
    device = Device.objects.get(node__name="alpha", index=1)
    assert (device.pci_bus_id, device.temperature_c, device.power_draw_w) == ("00000000:9B:00.0", 71, 612.5)
    assert device.as_gpu_device().to_dict() == snap["devices"][1]
    sample = DeviceSample.objects.get(device=device)
    assert (sample.temperature_c, sample.power_draw_w) == (71, 612.5)


@pytest.mark.parametrize("extra", [
    pytest.param({}, id="plain"),
    pytest.param(HEALTH, id="every-health-field"),
    pytest.param({"attached_idle": [{"id": "9e8d", "name": "idle", "image": "cuda:12", "claim": None}], "processes": [],
                  "throttle_reasons": None}, id="attached-idle"),
])
def test_a_reported_gpu_is_the_dict_pydantic_dumps(extra):
    """Ingest reads a validated GPU as a dict without pydantic's serializer: the same dict,
    and the same GPU for the domain."""
    snap = snapshot("alpha", 1)
    snap["devices"][0].update(extra)
    reported = schema.parse_snapshot(snap).devices[0]
    assert reported.as_dict() == reported.model_dump()
    assert gpu.Device.from_dict(reported.as_dict()) == gpu.Device.from_dict(snap["devices"][0])


@pytest.mark.parametrize("version,upgrade", [(1, "the agent"), (3, "the site")])
def test_a_snapshot_of_another_schema_version_is_refused_saying_which_version_the_site_reads(version, upgrade):
    assert wire.SNAPSHOT_SCHEMA_VERSION == 2
    snap = snapshot("alpha", 2)
    snap["schema_version"] = version
    for data in (snap, wire.encode_snapshot(snap)):
        result = ingest_snapshot(data)
        assert result.outcome == REJECTED
        assert result.reason == f"schema_version {version} is not read here: this site reads version 2 only; upgrade {upgrade}"
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    "field,value",
    [("temperature_c", -1), ("power_draw_w", float("inf")), ("ecc_corrected_volatile", 2**64),
     ("throttle_reasons", ["made_up"]), ("pci_bus_id", "x" * 40)],
)
def test_it_rejects_out_of_bounds_health_values(field, value):
    snap = snapshot("alpha", 1)
    snap["devices"][0][field] = value
    result = ingest_snapshot(snap)
    assert result.outcome == REJECTED and field in result.reason
    assert not Node.objects.exists()


def test_a_gpu_that_vanished_fails_its_node_and_counts_as_lost_capacity():
    first = snapshot("alpha", 8)
    ingest_snapshot(first)
    fewer = snapshot("alpha", 7, at=later(first))
    assert ingest_snapshot(fewer).outcome == ACCEPTED
    node = Node.objects.get(name="alpha")
    assert node.health == "fail" and node.gpus_lost == 1 and node.gpu_count == 7
    lost = node.findings.get(code="lost-capacity")
    assert lost.status == "fail" and "1 GPU no longer reported" in lost.message and "GPU 7" in lost.message
    assert FleetSummary().tiles["lost"] == 1


def test_a_node_whose_detection_fails_keeps_its_last_gpus_as_lost():
    first = snapshot("alpha", 8)
    ingest_snapshot(first)
    broken = snapshot("alpha", 0, at=later(first))
    assert ingest_snapshot(broken).outcome == ACCEPTED
    node = Node.objects.get(name="alpha")
    assert node.gpus_lost == 8 and node.devices.count() == 8
    assert "8 GPUs no longer reported" in node.findings.get(code="lost-capacity").message


def test_a_returning_gpu_is_no_longer_lost():
    first = snapshot("alpha", 8)
    ingest_snapshot(first)
    fewer = snapshot("alpha", 7, at=later(first))
    ingest_snapshot(fewer)
    again = snapshot("alpha", 8, at=later(fewer))
    ingest_snapshot(again)
    node = Node.objects.get(name="alpha")
    assert node.gpus_lost == 0 and not node.findings.filter(code="lost-capacity").exists()


def test_claims_that_overlap_when_a_vanished_gpu_returns_become_a_finding(admin_user):
    first = snapshot("alpha", 2)
    ingest_snapshot(first)
    node = Node.objects.get(name="alpha")
    gpu1 = node.devices.get(index=1).uuid
    save_claim(node, gpu.Claim(name="pinned", device_ids=(gpu1,)), admin_user)
    gone = snapshot("alpha", 1, at=later(first))
    ingest_snapshot(gone)
    save_claim(Node.objects.get(name="alpha"), gpu.Claim(name="everything", count=0), admin_user)  # fits 1 GPU
    back = snapshot("alpha", 2, at=later(gone))
    ingest_snapshot(back)
    node = Node.objects.get(name="alpha")
    overlap = node.findings.get(code="claims-overlap")
    assert node.health == "fail" and "'everything'" in overlap.message and "'pinned'" not in overlap.message


def test_the_node_keeps_its_worst_finding_in_words_and_its_gpu_models():
    snap = snapshot("alpha", 2)
    snap["findings"] += [
        {"code": "gpu1.thermal", "name": "GPU 1", "status": "warn", "message": "Running hot at 88 °C"},
        {"code": "gpu0.ecc", "name": "GPU 0", "status": "fail", "message": "4 uncorrectable ECC errors"},
    ]
    ingest_snapshot(snap)
    node = Node.objects.get(name="alpha")
    assert node.problem == "GPU 0: 4 uncorrectable ECC errors (+1 more)"
    assert node.gpu_models == "NVIDIA H200"
    healthy = snapshot("alpha", 2, at=later(snap))
    ingest_snapshot(healthy)
    assert Node.objects.get(name="alpha").problem == ""


@pytest.mark.postgresql
def test_on_postgresql_a_snapshot_rewrites_its_gpus_rows_in_place():
    """The node and GPU tables keep room on each page (fillfactor 50, migration
    fleet/0001), so each snapshot's new row versions stay beside the old ones (HOT
    updates) instead of adding index entries that later snapshots read through."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname IN ('fleet_node', 'fleet_device')")
        assert {name: options for name, options in cursor.fetchall()} == {
            "fleet_node": ["fillfactor=50"], "fleet_device": ["fillfactor=50"]}
        # Nodes enough to fill pages (about 5 GPU rows fit in a full one).
        firsts = [snapshot(f"n{i}", gpus=8) for i in range(4)]
        ingest_snapshots(firsts)
        # This transaction's own counts (the test runs in one, which earlier work may share).
        counts = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'fleet_device'"
        cursor.execute(counts)
        before = cursor.fetchone()
        assert {r.outcome for r in ingest_snapshots([snapshot(s["node"], gpus=8, at=later(s)) for s in firsts])} == {
            ACCEPTED}
        cursor.execute(counts)
        updated, in_place = (after - earlier for after, earlier in zip(cursor.fetchone(), before, strict=True))
    assert updated == 4 * 8 and in_place == updated
