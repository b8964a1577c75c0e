"""GET /api/nodes/ and the per-node reads: the documented fields, pages, and a fixed
number of queries whatever the fleet size."""

from __future__ import annotations

import pytest

from gpufleet.api import pagination
from gpufleet.ingest.services import ingest_snapshot
from tests.claims.helpers import claim, make_node, shrink_node, uuid
from tests.factories import ingest, snapshot
from tests.fleet.test_commands import DEVICE_KEYS

pytestmark = pytest.mark.django_db

NODE_FIELDS = {
    "name",
    "status",
    "health",
    "gpu_count",
    "vram_total_mib",
    "vram_used_mib",
    "gpus_reserved",
    "gpus_free",
    "gpus_lost",
    "problem",
    "driver_version",
    "toolkit_version",
    "attach",
    "last_seen",
    "collected_at",
}


def test_it_lists_nodes_with_their_figures(viewer_client, operator):
    alpha = make_node("alpha", 8)
    claim(alpha, "train", operator, count=3)
    make_node("beta", 0)
    response = viewer_client.get("/api/nodes/")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert (body["count"], body["page"], body["pages"], body["next"], body["previous"]) == (2, 1, 1, None, None)
    first, second = body["results"]
    assert set(first) == NODE_FIELDS
    assert {k: first[k] for k in ("name", "status", "health", "gpu_count", "gpus_reserved", "gpus_free", "attach")} == {
        "name": "alpha",
        "status": "ok",
        "health": "ok",
        "gpu_count": 8,
        "gpus_reserved": 3,
        "gpus_free": 5,
        "attach": "legacy",
    }
    assert first["vram_total_mib"] == 8 * 143771 and first["vram_used_mib"] == 8 * 1024
    assert first["driver_version"] == "570.133.20"
    assert first["toolkit_version"].endswith("1.18.2")
    assert first["collected_at"] and first["last_seen"]
    assert (second["name"], second["status"], second["gpu_count"], second["attach"]) == ("beta", "fail", 0, "none")
    assert first["problem"] == "" and second["problem"] and first["gpus_lost"] == 0


def test_it_lists_a_node_that_lost_a_gpu_with_its_lost_capacity_and_problem(viewer_client):
    shrink_node(ingest("gamma", 2), 1)
    [node] = viewer_client.get("/api/nodes/").json()["results"]
    assert node["gpus_lost"] == 1 and node["problem"].startswith("Lost GPUs")


def test_it_pages_with_page(viewer_client, monkeypatch):
    monkeypatch.setattr(pagination, "PAGE_SIZE", 2)
    for name in ["a", "b", "c"]:
        make_node(name, 1)
    first = viewer_client.get("/api/nodes/").json()
    assert [n["name"] for n in first["results"]] == ["a", "b"]
    assert first["next"] == "http://testserver/api/nodes/?page=2"
    second = viewer_client.get("/api/nodes/?page=2").json()
    assert [n["name"] for n in second["results"]] == ["c"]
    assert second["previous"] == "http://testserver/api/nodes/?page=1"
    assert viewer_client.get("/api/nodes/?page=3").json()["error"]["code"] == "bad_page"
    assert viewer_client.get("/api/nodes/?page=3").status_code == 404
    for junk in ["x", "0", "-1"]:
        refused = viewer_client.get(f"/api/nodes/?page={junk}")
        assert refused.status_code == 400, junk
        assert refused.json()["error"] == {"code": "bad_page", "message": "page must be a whole number from 1", "field": "page"}


@pytest.mark.parametrize("nodes", [1, 7])
def test_it_lists_nodes_in_fixed_queries(viewer_client, django_assert_num_queries, nodes):
    for n in range(nodes):
        make_node(f"node-{n}", 2)
    # session, user, user perms, group perms, count, page
    with django_assert_num_queries(6):
        response = viewer_client.get("/api/nodes/")
    assert len(response.json()["results"]) == nodes


def test_it_gives_a_node_with_devices_findings_claims_and_ledger(viewer_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, device_ids=["2"])
    body = viewer_client.get("/api/nodes/alpha/").json()
    assert set(body) >= NODE_FIELDS
    assert body["ledger"] == {"total": 4, "reserved": 1, "free": 3, "holders": ["train"]}
    assert [(d["index"], d["uuid"], d["holder"]) for d in body["devices"]] == [
        (0, uuid(node, 0), None),
        (1, uuid(node, 1), None),
        (2, uuid(node, 2), "train"),
        (3, uuid(node, 3), None),
    ]
    assert body["devices"][0]["name"] == "NVIDIA H200"
    assert {f["code"] for f in body["findings"]} >= {"driver", "gpu0", "toolkit", "runtime", "attach"}
    assert body["claims"] == [
        {
            "id": train.pk,
            "node": "alpha",
            "name": "train",
            "mode": "devices",
            "count": 0,
            "device_ids": ["2"],
            "missing_devices": [],
            "created_by": "otto",
            "owner": "otto",
            "team": "lab",
            "contact": "",
            "starts_at": train.starts_at.isoformat(),
            "ends_at": None,
            "in_force": True,
            "ended": False,
            "series": None,
            "created_at": train.created_at.isoformat(),
            "updated_at": train.updated_at.isoformat(),
            "quota_override_reason": "",
        }
    ]


def test_it_lists_a_nodes_devices_vanished_ones_included(viewer_client, operator):
    node = make_node("alpha", 4)
    claim(node, "train", operator, device_ids=[uuid(node, 3)])
    shrink_node(node, 2)
    body = viewer_client.get("/api/nodes/alpha/devices/").json()
    assert body["node"] == "alpha"
    assert [(d["index"], d["vanished_at"] is not None, d["holder"]) for d in body["results"]] == [
        (0, False, None),
        (1, False, None),
        (2, True, None),
        (3, True, None),
    ]


def test_it_lists_a_nodes_findings(viewer_client):
    make_node("empty", 0)
    body = viewer_client.get("/api/nodes/empty/findings/").json()
    driver = next(f for f in body["results"] if f["code"] == "driver")
    assert driver["status"] == "fail"
    assert "fix" in driver


def test_it_is_404_json_for_an_unknown_node(viewer_client):
    for url in ["/api/nodes/nope/", "/api/nodes/nope/devices/", "/api/nodes/nope/findings/", "/api/nodes/nope/claims/"]:
        response = viewer_client.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"] == {"code": "not_found", "message": "there is no node 'nope'"}


def test_it_answers_a_wrong_method_with_405_json(viewer_client, operator_client):
    response = operator_client.post("/api/nodes/")
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_it_answers_head_like_get_without_a_body(viewer_client):
    make_node("alpha", 1)
    response = viewer_client.head("/api/nodes/alpha/")
    assert response.status_code == 200
    assert response.content == b""


def test_it_is_404_json_for_an_unknown_api_path(viewer_client):
    for url in ["/api/nope/", "/api/claims/abc/"]:
        response = viewer_client.get(url)
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found"
    # Without the trailing slash Django's APPEND_SLASH redirect still comes first.
    assert viewer_client.get("/api/nodes").status_code == 301


def test_the_node_list_takes_the_overview_s_filters(viewer_client, make_fleet):
    make_fleet(3, prefix="gpu")
    ingest("xeon-01", 0)
    body = viewer_client.get("/api/nodes/", {"health": "fail"}).json()
    assert [n["name"] for n in body["results"]] == ["xeon-01"]
    body = viewer_client.get("/api/nodes/", {"q": "gpu", "sort": "-name"}).json()
    assert [n["name"] for n in body["results"]] == ["gpu-02", "gpu-01", "gpu-00"]
    # Unlike the overview (worst first), the API lists by name unless told: a client
    # paging through it must not see rows move as health changes.
    assert [n["name"] for n in viewer_client.get("/api/nodes/").json()["results"]] == [
        "gpu-00", "gpu-01", "gpu-02", "xeon-01"
    ]
    assert viewer_client.get("/api/nodes/", {"sort": "-health"}).json()["results"][0]["name"] == "xeon-01"


def test_an_invalid_filter_is_a_400_naming_it(viewer_client, make_fleet):
    make_fleet(2)
    response = viewer_client.get("/api/nodes/", {"health": "purple"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_filter" and "health" in response.json()["error"]["message"]


def test_a_node_s_devices_carry_the_doctor_s_health_keys(viewer_client):
    snap = snapshot("alpha", 1)
    snap["devices"][0].update(temperature_c=83, power_draw_w=650.5, ecc_uncorrected_volatile=2,
                              throttle_reasons=["sw_thermal_slowdown"], mig_mode=True,
                              mig_devices=[{"uuid": "MIG-aaaa", "profile": "7g.80gb", "device": 0}],
                              xid_errors=[{"xid": 48, "count": 1, "last_seen": None, "description": "DBE"}])
    assert ingest_snapshot(snap).outcome == "accepted"
    for body in (viewer_client.get("/api/nodes/alpha/").json()["devices"][0],
                 viewer_client.get("/api/nodes/alpha/devices/").json()["results"][0]):
        assert list(body)[:len(DEVICE_KEYS)] == DEVICE_KEYS
        assert (body["temperature_c"], body["power_draw_w"], body["ecc_uncorrected_volatile"]) == (83, 650.5, 2)
        assert body["throttle_reasons"] == ["sw_thermal_slowdown"]
        assert body["mig_devices"] == [{"uuid": "MIG-aaaa", "profile": "7g.80gb", "device": 0}]
        assert body["xid_errors"] == [{"xid": 48, "count": 1, "last_seen": None, "description": "DBE"}]
