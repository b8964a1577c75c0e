"""Claims against real use, found at ingest: a busy GPU that no claim holds and a
container whose gpufleet.claim label names another claim become findings on the
node, and go away once the claims agree with the work."""

from __future__ import annotations

import pytest

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db

BOX = {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": "train-llm"}


def _busy(at=None) -> dict:
    snap = snapshot("alpha", 4, at=at)
    snap["devices"][2]["processes"] = [{"pid": 4412, "name": "python3", "used_mib": 30720, "container": BOX}]
    return snap


def _codes() -> set[str]:
    return {f.code for f in Node.objects.get(name="alpha").findings.all()}


def test_a_busy_gpu_without_a_claim_and_a_label_naming_no_claim_are_findings(viewer_client):
    ingest_snapshot(_busy())
    node = Node.objects.get(name="alpha")
    assert {"use-unclaimed", "use-misplaced"} <= _codes() and node.health == "warn"
    page = viewer_client.get(f"/nodes/{node.name}/").content.decode()
    assert "Used but unclaimed" in page and "GPU 2 (container trainer)" in page
    assert "no claim named &#x27;train-llm&#x27; on this node" in page


def test_a_claim_that_pins_the_gpu_under_the_label_s_name_clears_both(operator):
    first = _busy()
    ingest_snapshot(first)
    node = Node.objects.get(name="alpha")
    uuid = node.devices.get(index=2).uuid
    claims.save_claim(node, gpu.Claim(name="train-llm", device_ids=(uuid,)), operator)
    ingest_snapshot(_busy(at=later(first)))
    assert not _codes() & {"use-unclaimed", "use-misplaced"}


def test_the_label_s_claim_on_other_gpus_is_the_wrong_place(operator):
    first = _busy()
    ingest_snapshot(first)
    node = Node.objects.get(name="alpha")
    claims.save_claim(node, gpu.Claim(name="train-llm", device_ids=("0",)), operator)
    ingest_snapshot(_busy(at=later(first)))
    misplaced = node.findings.get(code="use-misplaced")
    assert "claim 'train-llm' holds other GPUs" in misplaced.message
    assert "use-unclaimed" in _codes()  # GPU 2 is still busy and held by nobody
