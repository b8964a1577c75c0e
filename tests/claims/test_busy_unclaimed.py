"""GPUs busy with work no claim holds are not free: find-a-node does not offer them,
and the overview and the node page do not count them free. The ledger still lets a
claim take them (the claim may be for that very work)."""

from __future__ import annotations

import pytest

from gpufleet import gpu
from gpufleet.claims.placement import fleet_placement
from gpufleet.fleet.models import Node
from gpufleet.fleet.summary import FleetSummary
from gpufleet.ingest.services import ingest_snapshot
from tests.claims.helpers import claim
from tests.factories import later, snapshot

pytestmark = pytest.mark.django_db

BOX = {"id": "4f1d9c2b8e7a", "name": "trainer", "image": "pytorch/pytorch:2.5.1", "claim": None}


def busy_snapshot(name: str, gpus: int = 2, busy: tuple[int, ...] = (0,), at=None, attached: bool = False) -> dict:
    """`gpus` GPUs, those in `busy` running a process of an unlabelled container (or,
    with `attached`, only attached to one)."""
    snap = snapshot(name, gpus, at=at, util="0")
    for index in busy:
        if attached:
            snap["devices"][index]["attached_idle"] = [BOX]
        else:
            snap["devices"][index]["processes"] = [{"pid": 4412, "name": "python3", "used_mib": 30720,
                                                   "container": BOX}]
    return snap


def stored(snap: dict) -> Node:
    result = ingest_snapshot(snap)
    assert result.outcome == "accepted", result
    return Node.objects.get(name=snap["node"])


def offered(count: int) -> list[str]:
    return [fit.name for fit in fleet_placement(gpu.PlacementRequest(count=count)).fits]


def test_a_node_with_one_of_two_gpus_busy_unclaimed_is_offered_for_one_gpu_but_not_two():
    node = stored(busy_snapshot("alpha"))
    assert node.gpus_busy_unclaimed == 1
    assert offered(1) == ["alpha"]
    assert offered(2) == []
    (ruled,) = fleet_placement(gpu.PlacementRequest(count=2)).ruled_out
    assert (ruled.code, ruled.reason) == ("too_few", "too few free GPUs (1 free of 2, 1 busy with work no claim holds)")
    assert fleet_placement(gpu.PlacementRequest(count=1)).fits[0].left_over == 0


def test_a_container_only_attached_holds_its_gpu_too():
    stored(busy_snapshot("alpha", attached=True))
    assert offered(1) == ["alpha"] and offered(2) == []


def test_whole_node_and_pinned_requests_leave_the_busy_gpu_alone():
    stored(busy_snapshot("alpha"))
    assert fleet_placement(gpu.PlacementRequest(count=0)).fits == []
    (fit,) = fleet_placement(gpu.PlacementRequest(count=1, model="h200")).fits
    assert fit.device_ids == (snapshot("alpha", 2)["devices"][1]["uuid"],)
    assert fleet_placement(gpu.PlacementRequest(count=2, model="h200")).fits == []


def test_a_counted_claim_covers_the_work_on_an_unpinned_gpu(operator):
    node = stored(busy_snapshot("alpha", gpus=4))
    claim(node, "train", operator, count=1)
    node.refresh_from_db()
    # The claim's save counted again: its count covers the busy GPU, three are free.
    assert (node.gpus_reserved, node.gpus_busy_unclaimed, node.gpus_free) == (1, 0, 3)
    assert offered(3) == ["alpha"]


def test_the_overview_and_node_page_do_not_count_the_busy_gpu_free(viewer_client):
    first = busy_snapshot("alpha", gpus=4, busy=(0, 2))
    stored(first)
    assert FleetSummary().tiles["free"] == 2
    assert "4 · 0 reserved · 2 free · 2 busy unclaimed" in " ".join(
        viewer_client.get("/nodes/alpha/").content.decode().split())
    # The work ends: the next snapshot frees them.
    stored(busy_snapshot("alpha", gpus=4, busy=(), at=later(first, 60)))
    assert Node.objects.get(name="alpha").gpus_busy_unclaimed == 0
    assert FleetSummary().tiles["free"] == 4


def test_a_claim_may_still_take_the_busy_gpu(operator):
    node = stored(busy_snapshot("alpha"))
    # The ledger books claims: this one is for the work already running there.
    saved = claim(node, "trainer", operator, device_ids=["0"])
    assert saved.pk and Node.objects.get(pk=node.pk).gpus_busy_unclaimed == 0
