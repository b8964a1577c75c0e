"""GET /api/placement: the fleet's placement answer, as the claims page gives it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet.fleet.models import Node
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def test_it_lists_fits_best_first_and_why_the_others_are_out(viewer_client, operator):
    make_node("big", 8)
    claim(make_node("half", 4), "train", operator, count=2)
    make_node("down", 4)
    Node.objects.filter(name="down").update(offline=True)
    body = viewer_client.get("/api/placement", {"count": "2"}).json()
    assert body["fits"] == [
        {"node": "half", "gpus": 2, "left_over": 0, "free_vram_mib": 2 * (143771 - 1024)},
        {"node": "big", "gpus": 2, "left_over": 6, "free_vram_mib": 2 * (143771 - 1024)},
    ]
    assert body["ruled_out"] == [{"node": "down", "code": "offline", "reason": "offline"}]
    assert body["ruled_out_counts"] == {"offline": 1}


def test_count_zero_is_every_gpu_of_one_node_and_vram_is_in_mib(viewer_client, operator):
    make_node("big", 8)
    claim(make_node("half", 4), "train", operator, count=2)
    body = viewer_client.get("/api/placement", {"count": "0", "min_free_vram_mib": "100000"}).json()
    assert [f["node"] for f in body["fits"]] == ["big"]
    assert body["ruled_out"][0]["reason"] == "too few free GPUs (2 free of 4)"
    too_much = viewer_client.get("/api/placement", {"count": "1", "min_free_vram_mib": "200000"}).json()
    assert too_much["fits"] == []
    assert too_much["ruled_out_counts"] == {"low_vram": 2}


def test_a_model_that_no_node_has(viewer_client):
    make_node("big", 8)
    body = viewer_client.get("/api/placement", {"model": "b200"}).json()
    assert body["fits"] == []
    assert body["ruled_out"] == [{"node": "big", "code": "no_model", "reason": "no GPU of model 'b200'"}]


@pytest.mark.parametrize("param, value", [("count", "-1"), ("count", "two"), ("min_free_vram_mib", "1.5")])
def test_a_bad_number_is_a_400_naming_it(viewer_client, param, value):
    response = viewer_client.get("/api/placement", {param: value})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_parameter"
    assert response.json()["error"]["field"] == param


def test_it_needs_a_login(client):
    assert client.get("/api/placement").status_code == 401


def test_stale_nodes_are_out(viewer_client):
    make_node("late", 2)
    Node.objects.filter(name="late").update(last_seen=timezone.now() - timedelta(days=1))
    assert viewer_client.get("/api/placement").json()["ruled_out_counts"] == {"stale": 1}
