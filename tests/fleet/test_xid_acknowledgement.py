"""Acknowledging a GPU's Xid errors: cleared now, through later snapshots, until a newer Xid."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.fleet.models import Node
from gpufleet.fleet.xid_acks import NothingToAcknowledge, acknowledge_xids
from gpufleet.gpu import newer_xids
from gpufleet.ingest.services import ACCEPTED, ingest_snapshot
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db

GSP = {"xid": 119, "count": 2, "last_seen": "2026-12-03T16:05:10+00:00", "description": "GSP RPC timeout"}


def _with_xid(snap: dict, index: int, *xids: dict) -> dict:
    snap["devices"][index]["xid_errors"] = list(xids)
    snap["findings"].append(
        {"code": f"gpu{index}.xid", "name": f"GPU {index}", "status": "fail", "message": "Kernel log: Xid 119 ×2",
         "fix": "Reset the GPU"}
    )
    return snap


def test_it_clears_the_finding_now_and_the_node_health_and_audits_it(admin_user):
    ingest_snapshot(_with_xid(snapshot("alpha", 2), 1, GSP))
    node = Node.objects.get(name="alpha")
    assert node.health == "fail"
    row = acknowledge_xids(node, 1, admin_user)
    assert row.status == "ok" and row.message.startswith(f"Acknowledged by {admin_user.username}")
    node.refresh_from_db()
    assert node.health == "ok"
    entry = AuditEntry.objects.get(action="xid.acknowledge")
    assert entry.node_id == node.pk and "GPU 1" in entry.target and entry.after["xid_errors"] == [GSP]


def test_it_stays_cleared_while_the_same_xids_are_reported(admin_user):
    first = _with_xid(snapshot("alpha", 2), 1, GSP)
    ingest_snapshot(first)
    acknowledge_xids(Node.objects.get(name="alpha"), 1, admin_user)
    again = _with_xid(snapshot("alpha", 2, at=later(first)), 1, GSP)
    assert ingest_snapshot(again).outcome == ACCEPTED
    node = Node.objects.get(name="alpha")
    assert node.health == "ok" and node.findings.get(code="gpu1.xid").status == "ok"


def test_a_newer_xid_brings_the_finding_back(admin_user):
    first = _with_xid(snapshot("alpha", 2), 1, GSP)
    ingest_snapshot(first)
    acknowledge_xids(Node.objects.get(name="alpha"), 1, admin_user)
    newer = {**GSP, "count": 3, "last_seen": "2026-12-03T17:30:00+00:00"}
    ingest_snapshot(_with_xid(snapshot("alpha", 2, at=later(first)), 1, newer))
    node = Node.objects.get(name="alpha")
    assert node.health == "fail" and node.findings.get(code="gpu1.xid").status == "fail"


def test_there_is_nothing_to_acknowledge_on_a_gpu_without_xids(admin_user):
    ingest_snapshot(snapshot("alpha", 2))
    with pytest.raises(NothingToAcknowledge, match="GPU 0 of alpha has no Xid errors"):
        acknowledge_xids(Node.objects.get(name="alpha"), 0, admin_user)
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "current,acknowledged,newer",
    [
        ([GSP], [GSP], False),
        ([{**GSP, "count": 1}], [GSP], False),  # the window slid past one of them
        ([{**GSP, "last_seen": "2026-12-04T00:00:00+00:00"}], [GSP], True),
        ([GSP, {"xid": 79, "count": 1, "last_seen": None, "description": ""}], [GSP], True),
        ([{"xid": 31, "count": 3, "last_seen": None, "description": ""}],
         [{"xid": 31, "count": 2, "last_seen": None, "description": ""}], True),
    ],
)
def test_newer_xids_compares_times_then_counts(current, acknowledged, newer):
    assert newer_xids(current, acknowledged) is newer
