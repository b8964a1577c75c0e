"""Claims against real use, found at ingest: a busy GPU that no claim holds and a
container whose gpufleet.claim label names another claim become findings on the
node, and go away once the claims agree with the work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from gpufleet import gpu
from gpufleet.claims import services as claims
from gpufleet.claims.models import Claim
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


# --- Claimed but idle, from every snapshot since the GPU was first seen -------------


def _quiet(at, busy_gpu: int | None = None) -> dict:
    snap = snapshot("alpha", 4, at=at)
    for device in snap["devices"]:
        device["utilization_percent"] = 0
    if busy_gpu is not None:
        snap["devices"][busy_gpu]["utilization_percent"] = 40
    return snap


def _train_claim(operator, at: datetime | None = None) -> None:
    """The claim "train" on GPUs 0 and 1, made `at` (now): a claim is idle from its start."""
    node = Node.objects.get(name="alpha")
    with time_machine.travel(at or datetime.now(UTC), tick=False):
        claims.save_claim(node, gpu.Claim(name="train", device_ids=("0", "1")), operator)


def test_one_quiet_snapshot_is_not_an_idle_claim(operator):
    ingest_snapshot(_quiet(datetime.now(UTC) - timedelta(minutes=1)))
    _train_claim(operator)
    ingest_snapshot(_quiet(datetime.now(UTC)))
    assert "claim-idle" not in _codes()
    assert Claim.objects.get(name="train").idle_since is None


def test_a_claim_quiet_for_the_idle_hours_is_claimed_but_idle_until_its_gpus_work(operator, settings):
    settings.GPUFLEET_IDLE_HOURS = 24
    now = datetime.now(UTC) - timedelta(hours=25)  # the story ends about now
    first_seen = now - timedelta(hours=25)
    ingest_snapshot(_quiet(first_seen))
    _train_claim(operator, first_seen)
    ingest_snapshot(_quiet(now - timedelta(hours=2)))
    ingest_snapshot(_quiet(now))
    node = Node.objects.get(name="alpha")
    idle = node.findings.get(code="claim-idle")
    assert "'train' (GPUs 0, 1)" in idle.message and "under 5% utilization" in idle.message
    assert Claim.objects.get(name="train").idle_since == first_seen
    assert node.health == "warn"

    ingest_snapshot(_quiet(now + timedelta(seconds=30), busy_gpu=1))  # GPU 1 works: the claim is in use
    assert "claim-idle" not in _codes()
    assert Claim.objects.get(name="train").idle_since is None
    # And it takes the idle hours again, counted from that last work, to say so anew.
    ingest_snapshot(_quiet(now + timedelta(hours=23)))
    assert "claim-idle" not in _codes()
    ingest_snapshot(_quiet(now + timedelta(hours=24, minutes=1)))
    assert Claim.objects.get(name="train").idle_since == now + timedelta(seconds=30)


def test_work_two_hours_ago_keeps_a_claim_off_the_idle_list(operator):
    now = datetime.now(UTC)
    ingest_snapshot(_quiet(now - timedelta(hours=30)))
    _train_claim(operator, now - timedelta(hours=30))
    ingest_snapshot(_quiet(now - timedelta(hours=2), busy_gpu=0))
    ingest_snapshot(_quiet(now))
    assert "claim-idle" not in _codes()
    # A count claim is judged by the unpinned GPUs, which never worked.
    with time_machine.travel(now - timedelta(hours=25), tick=False):
        claims.save_claim(Node.objects.get(name="alpha"), gpu.Claim(name="eval", count=1), operator)
    ingest_snapshot(_quiet(now + timedelta(seconds=30)))
    assert "'eval' (GPUs 2, 3)" in Node.objects.get(name="alpha").findings.get(code="claim-idle").message
