"""Batched ingest: many snapshots in one transaction, each with the guarantees it has alone."""

from __future__ import annotations

import gc

import pytest
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from gpufleet import wire
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.ingest import services, stream
from gpufleet.ingest.services import ACCEPTED, REJECTED, STALE, ingest_snapshot, ingest_snapshots
from gpufleet.jobs.models import Job, JobKind, JobStatus
from tests.factories import agent_entry, ingest_entry, later, snapshot

pytestmark = pytest.mark.django_db


def test_it_stores_a_mixed_batch_each_snapshot_on_its_own_merits():
    known = snapshot("known", gpus=2)
    assert ingest_snapshot(known).outcome == ACCEPTED
    older = snapshot("twice", gpus=2, used_mib=100)
    newer = snapshot("twice", gpus=2, used_mib=5000, at=later(older))
    bad = snapshot("known", gpus=2, at=later(known))
    bad["devices"][0]["vram_used_mib"] = -1
    stale = snapshot("known", gpus=2, at=later(known, -60))
    good = snapshot("fresh", gpus=8)

    results = ingest_snapshots([newer, bad, good, older, stale])

    assert [r.outcome for r in results] == [ACCEPTED, REJECTED, ACCEPTED, STALE, STALE]
    assert "vram_used_mib" in results[1].reason
    assert results[3].reason == "a newer snapshot of this node came in the same batch"
    assert results[4].reason == "not newer than the stored snapshot"
    assert Node.objects.get(name="twice").vram_used_mib == 2 * 5000
    assert Node.objects.get(name="fresh").gpu_count == 8
    assert DeviceSample.objects.filter(device__node__name="twice").count() == 2  # the older one wrote nothing
    # The known node's bad snapshot fails it with the reason, as it would alone.
    known_node = Node.objects.get(name="known")
    assert known_node.health == "fail" and known_node.findings.filter(code="rejected-snapshot").exists()


def test_a_good_snapshot_after_a_bad_one_of_the_same_node_wins():
    first = snapshot("n", gpus=1)
    ingest_snapshot(first)
    bad = snapshot("n", gpus=1, at=later(first))
    bad["extra"] = 1
    results = ingest_snapshots([bad, snapshot("n", gpus=1, at=later(first, 60))])
    assert [r.outcome for r in results] == [REJECTED, ACCEPTED]
    assert not Finding.objects.filter(node__name="n", code="rejected-snapshot").exists()


@pytest.mark.parametrize("attribute,value", [
    pytest.param("index", None, id="refused-by-a-constraint"),
    # SQLite stores the escaped surrogate, and its driver refuses such text before the
    # database sees it: only validation keeps it out there.
    pytest.param("health", {"pstate": "P\ud800"}, id="refused-while-copied", marks=pytest.mark.postgresql),
    pytest.param("name", "NVIDIA \ud800", id="text-no-utf8-holds", marks=pytest.mark.postgresql),
])
def test_a_snapshot_the_database_refuses_is_rejected_alone(monkeypatch, attribute, value):
    """A value that passes validation but that the database refuses (a GPU without an
    index, NOT NULL; JSON no UTF-8 holds, refused by COPY on PostgreSQL): the batch
    falls back to one transaction per snapshot, so the others are stored whole and
    the refused one writes nothing."""
    refused = {}

    def refusing(node_pk, reported, *args):
        row = device_row(node_pk, reported, *args)
        return _replaced(row, attribute, value) if node_pk == refused.get("pk") else row

    device_row = services._device_row
    monkeypatch.setattr(services, "_device_row", refusing)
    monkeypatch.setattr(services, "_locked_nodes", _noting_the_pk_of("refused", refused))
    results = ingest_snapshots([snapshot("ok-1", gpus=2), snapshot("refused", gpus=2), snapshot("ok-2", gpus=2)])

    assert [r.outcome for r in results] == [ACCEPTED, REJECTED, ACCEPTED]
    assert results[1].reason.startswith("the database refused it:")
    assert Device.objects.filter(node__name__in=["ok-1", "ok-2"]).count() == 4
    assert not Device.objects.filter(node__name="refused").exists()
    assert not Node.objects.filter(name="refused").exists()  # its transaction made the node and was undone


def _replaced(row: tuple, field: str, value) -> tuple:
    """A GPU row of ingest (services._DEVICE_FIELDS) with one value replaced."""
    values = dict(zip(services._DEVICE_FIELDS, row, strict=True))
    values[field] = value
    return tuple(values.values())


def _noting_the_pk_of(name: str, noted: dict):
    """services._locked_nodes, noting in `noted` the primary key of node `name` when it locks it."""
    locked_nodes = services._locked_nodes

    def noting(names, now):
        nodes = locked_nodes(names, now)
        if name in nodes:
            noted["pk"] = nodes[name].pk
        return nodes

    return noting


def _statements(batch: list[dict]) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert {r.outcome for r in ingest_snapshots(batch)} == {ACCEPTED}
    return len([q for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))])


@pytest.mark.parametrize("findings_changed", [0, 1, "all"])
@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("size", [1, 5])
def test_statements_per_batch_do_not_grow_with_batch_size_or_gpu_count(size, gpus, findings_changed):
    names = [f"n{i}" for i in range(size)]
    firsts = [snapshot(name, gpus=gpus) for name in names]
    ingest_snapshots(firsts)
    for node in Node.objects.all():
        Claim.objects.create(node=node, name="job", count=1)
    seconds = [snapshot(s["node"], gpus=gpus, at=later(s)) for s in firsts]
    for second in seconds[:size if findings_changed == "all" else findings_changed]:
        second["findings"][0]["message"] += " (changed)"
    # On PostgreSQL each of the two upserts (nodes, GPUs) is four statements: make the
    # staging table if missing, empty it, COPY into it, INSERT ... ON CONFLICT ... RETURNING
    # from it; elsewhere the GPU upsert reads the GPUs' first_seen and busy_at first.
    # The nodes' findings are replaced, changed or not, in two statements (delete, insert),
    # however many nodes that is. The nodes' open events are read once
    # (tests/events/test_detection.py: what events cost). The snapshots' GPU time is
    # added into the usage rows in one statement (gpufleet/usage/record.py).
    expected = 17 if connection.vendor == "postgresql" else 12
    assert _statements(seconds) == expected
    assert Device.objects.count() == size * gpus
    changed = Finding.objects.filter(message__endswith=" (changed)").values_list("node__name", flat=True)
    assert sorted(changed) == sorted(s["node"] for s in seconds if s["findings"][0]["message"].endswith(" (changed)"))


@pytest.mark.parametrize("size", [1, 5])
def test_xid_findings_cost_a_batch_one_read_of_acknowledgements_whatever_its_size(size):
    # A failing fleet reports Xids on many nodes at once: their acknowledgements are read
    # once for the batch, not once a node.
    def with_xid(data: dict) -> dict:
        data["devices"][0]["xid_errors"] = [{"xid": 79, "count": 1, "last_seen": data["collected_at"],
                                             "description": "GPU has fallen off the bus"}]
        data["findings"].append({"code": "gpu0.xid", "name": "GPU 0", "status": "fail",
                                 "message": "Kernel log: Xid 79", "fix": ""})
        return data

    firsts = [with_xid(snapshot(f"n{i}", gpus=2)) for i in range(size)]
    ingest_snapshots(firsts)
    clean = [snapshot(s["node"], gpus=2, at=later(s)) for s in firsts]
    xids = [with_xid(snapshot(s["node"], gpus=2, at=later(s, 60))) for s in firsts]
    without = _statements(clean)
    assert _statements(xids) == without + 1


def test_the_ingest_consumer_finishes_the_job_its_snapshot_answers(admin_user):
    node = Node.objects.create(name="n")
    job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE, requested_by=admin_user)
    bad = snapshot("m", gpus=1)
    bad["extra"] = 1
    assert ingest_entry(snapshot("n", gpus=1), job.pk) == ACCEPTED
    assert ingest_entry(bad) == REJECTED
    job.refresh_from_db()
    assert job.status == JobStatus.DONE


def test_a_diagnosis_is_done_when_a_newer_snapshot_of_its_node_lands_in_the_same_batch(admin_user):
    """The agent's next scheduled snapshot, taken after the job's, often arrives in the
    job's batch; the job's snapshot is then superseded, and the newer one answers it."""
    node = Node.objects.create(name="n")
    job = Job.objects.create(node=node, kind=JobKind.DIAGNOSE, requested_by=admin_user)
    answer = snapshot("n", gpus=1)
    scheduled = snapshot("n", gpus=1, at=later(answer))
    assert stream.ingest_entries([agent_entry(answer, job.pk), agent_entry(scheduled)]) == [STALE, ACCEPTED]
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and job.output == "a newer snapshot of the node is stored"


def test_a_snapshot_superseded_by_one_the_database_refuses_is_rejected_too(monkeypatch):
    """Neither was stored, so the older one must not read as merely stale."""
    def refusing(node_pk, reported, *args):
        row = device_row(node_pk, reported, *args)
        return _replaced(row, "index", None) if reported["vram_used_mib"] == 666 else row

    device_row = services._device_row
    monkeypatch.setattr(services, "_device_row", refusing)
    older = snapshot("n", gpus=1)
    newer = snapshot("n", gpus=1, used_mib=666, at=later(older))
    results = ingest_snapshots([older, newer])
    assert [r.outcome for r in results] == [REJECTED, REJECTED]
    assert results[0].reason == "a newer snapshot of this node in the same batch was refused"
    assert not Node.objects.filter(name="n").exists()


def test_a_batch_gives_each_entry_its_own_outcome_in_one_store(monkeypatch):
    good = agent_entry(snapshot("good", gpus=1))
    forged = {**agent_entry(snapshot("forged", gpus=1)), b"sig": b"0" * 64}
    other = agent_entry(snapshot("theirs", gpus=1), node="mine")  # signed by "mine", about "theirs"
    stores = []
    real = services.ingest_snapshots
    monkeypatch.setattr(stream, "ingest_snapshots", lambda batch: stores.append(len(batch)) or real(batch))
    entries = [good, forged, other, {}, good]  # {}: no fields at all; the last one a copy: a replay
    assert stream.ingest_entries(entries) == [ACCEPTED, REJECTED, REJECTED, REJECTED, REJECTED]
    assert stores == [1]  # the one whose signature holds and that is no copy
    assert list(Node.objects.values_list("name", flat=True)) == ["good"]


def test_bodies_that_inflate_past_the_batch_bound_wait_for_a_later_batch(monkeypatch):
    monkeypatch.setattr(stream, "BATCH_INFLATED_MAX", wire.ENTRY_INFLATED_MAX + 20_000)
    entries = [agent_entry(snapshot(f"n{i}", gpus=1)) for i in range(60)]
    outcomes = stream.ingest_entries(entries)
    deferred = outcomes.index(stream.DEFERRED)
    assert 0 < deferred < 60 and outcomes[:deferred] == [ACCEPTED] * deferred
    assert outcomes[deferred:] == [stream.DEFERRED] * (60 - deferred)
    assert Node.objects.count() == deferred


def test_it_retries_while_the_database_is_unreachable(monkeypatch):
    calls = []

    def flaky(snapshots):
        calls.append(len(snapshots))
        if len(calls) < 3:
            raise OperationalError("server closed the connection unexpectedly")
        return real(snapshots)

    real = services.ingest_snapshots
    monkeypatch.setattr(stream, "ingest_snapshots", flaky)
    slept, closed = [], []
    monkeypatch.setattr(stream.time, "sleep", slept.append)
    # The broken connection is dropped before each new try (here not for real: the
    # test's own database connection must stay open).
    monkeypatch.setattr(stream, "close_old_connections", lambda: closed.append(True))
    results = stream.store_with_retries([snapshot("n", gpus=1)], delays=(1, 2, 4))
    assert calls == [1, 1, 1] and slept == [1, 2] and len(closed) == 2
    assert results[0].outcome == ACCEPTED and Node.objects.filter(name="n").exists()


def test_it_raises_when_the_database_stays_unreachable(monkeypatch):
    def down(snapshots):
        raise OperationalError("connection refused")

    monkeypatch.setattr(stream, "ingest_snapshots", down)
    monkeypatch.setattr(stream.time, "sleep", lambda s: None)
    monkeypatch.setattr(stream, "close_old_connections", lambda: None)
    with pytest.raises(OperationalError):
        stream.store_with_retries([snapshot("n", gpus=1)], delays=(1,))


@pytest.fixture
def collector_restored():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.django_db(False)
def test_the_consumer_collects_garbage_less_often(collector_restored):
    """What the process holds from its start leaves the collector's generations, and the
    youngest is collected after GC_YOUNG_THRESHOLD new objects instead of Python's 700."""
    assert gc.get_freeze_count() == 0
    stream.tune_garbage_collector()
    assert gc.get_threshold()[0] == stream.GC_YOUNG_THRESHOLD > 700
    assert gc.get_freeze_count() > 10_000  # the modules and Django loaded in this process
