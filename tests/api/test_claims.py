"""The writable claims API: 201 with the claim, the ledger's machine code on a
refusal (422 for a wrong claim, 409 for a conflict), 400 for unreadable JSON,
audited like every other change."""

from __future__ import annotations

import json
from unittest.mock import ANY
from urllib.parse import urlencode

import pytest

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import claim, make_node, uuid

pytestmark = pytest.mark.django_db


def _post(client, node: str, body, raw: bool = False):
    data = body if raw else json.dumps(body)
    return client.post(f"/api/nodes/{node}/claims/", data, content_type="application/json")


def _put(client, pk: int, body):
    return client.put(f"/api/claims/{pk}/", json.dumps(body), content_type="application/json")


def _delete(client, pk: int, version: str | None):
    query = "" if version is None else "?" + urlencode({"updated_at": version})
    return client.delete(f"/api/claims/{pk}/{query}")


def _version(client, pk: int) -> str:
    return client.get(f"/api/claims/{pk}/").json()["updated_at"]


def _unchanged(train: Claim) -> tuple:
    """What a refused write must leave as it was: the row and the audit log."""
    row = Claim.objects.filter(pk=train.pk).values("name", "count", "device_ids", "updated_at").first()
    return row, AuditEntry.objects.count()


def test_it_creates_a_claim_and_answers_201(operator_client, operator):
    node = make_node("alpha", 8)
    response = _post(operator_client, "alpha", {"name": "train", "count": 3})
    assert response.status_code == 201
    body = response.json()
    saved = Claim.objects.get(node=node, name="train")
    assert body["id"] == saved.pk
    assert {k: body[k] for k in ("node", "name", "mode", "count", "device_ids", "created_by")} == {
        "node": "alpha",
        "name": "train",
        "mode": "count",
        "count": 3,
        "device_ids": [],
        "created_by": "otto",
    }
    assert Node.objects.get(pk=node.pk).gpus_reserved == 3
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.user, entry.before, entry.after) == (
        "claim.create",
        operator,
        None,
        {"name": "train", "count": 3, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None},
    )


def test_it_pins_devices_by_index_or_uuid(operator_client):
    node = make_node("alpha", 4)
    response = _post(operator_client, "alpha", {"name": "pin", "device_ids": [1, uuid(node, 2)]})
    assert response.status_code == 201
    assert response.json()["device_ids"] == ["1", uuid(node, 2)]
    assert response.json()["mode"] == "devices"


def test_it_reads_no_count_and_no_devices_as_every_gpu(operator_client):
    make_node("alpha", 4)
    body = _post(operator_client, "alpha", {"name": "everything"}).json()
    assert (body["mode"], body["count"]) == ("all", 0)
    assert Node.objects.get(name="alpha").gpus_reserved == 4


@pytest.mark.parametrize(
    "gpus, attach, existing, body, status, code, message",
    [
        (0, "legacy", None, {"name": "j", "count": 1}, 409, "no_gpu", "The node reports no NVIDIA GPU."),
        (
            2,
            "none",
            None,
            {"name": "j", "count": 1},
            409,
            "runtime_missing",
            "The node's GPUs cannot be attached to containers: Docker has neither the nvidia runtime nor NVIDIA CDI devices.",
        ),
        (
            2,
            "legacy",
            None,
            {"name": "j", "device_ids": ["9"]},
            422,
            "unknown_device",
            "GPU '9' is not present on the node.",
        ),
        (
            2,
            "legacy",
            None,
            {"name": "j", "device_ids": ["1", "1"]},
            422,
            "duplicate_device",
            "GPU '1' names GPU 1, which the claim already names.",
        ),
        (
            2,
            "legacy",
            {"name": "train", "device_ids": ("1",)},
            {"name": "j", "device_ids": ["1"]},
            409,
            "device_taken",
            "GPU 1 ('1') is already reserved by train.",
        ),
        (
            8,
            "legacy",
            {"name": "train", "count": 6},
            {"name": "j", "count": 3},
            409,
            "insufficient",
            "Needs 3 GPUs but only 2 of 8 are free.",
        ),
        (
            8,
            "legacy",
            {"name": "train", "count": 1},
            {"name": "j"},
            409,
            "insufficient",
            "Needs every GPU but 1 of 8 is reserved by train.",
        ),
        (
            8,
            "legacy",
            {"name": "j", "count": 1},
            {"name": "j", "count": 1},
            409,
            "name_taken",
            "Node alpha already has a claim named 'j'.",
        ),
    ],
)
def test_it_answers_a_refusal_with_the_ledger_code(
    operator_client, operator, gpus, attach, existing, body, status, code, message
):
    node = make_node("alpha", gpus, attach=attach)
    if existing:
        services.save_claim(node, gpu.Claim(**existing), operator)
    before = (Claim.objects.count(), AuditEntry.objects.count())
    response = _post(operator_client, "alpha", body)
    assert response.status_code == status
    assert response.json() == {"error": {"code": code, "message": message}}
    assert (Claim.objects.count(), AuditEntry.objects.count()) == before


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "the request body is not valid JSON"),
        ("", "the request body is not valid JSON"),
        ('["a list"]', "the request body must be a JSON object"),
        (b"\xff\xfe", "the request body is not valid JSON"),
    ],
)
def test_it_answers_unreadable_json_with_400(operator_client, raw, message):
    make_node("alpha", 2)
    response = _post(operator_client, "alpha", raw, raw=True)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_json"
    assert response.json()["error"]["message"].startswith(message)
    assert not Claim.objects.exists()


@pytest.mark.parametrize(
    "body, field",
    [
        ({"count": 1}, "name"),
        ({"name": "  ", "count": 1}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "j", "count": -1}, "count"),
        ({"name": "j", "count": True}, "count"),
        ({"name": "j", "count": "2"}, "count"),
        ({"name": "j", "device_ids": "0"}, "device_ids"),
        ({"name": "j", "device_ids": [None]}, "device_ids"),
        ({"name": "j", "count": 1, "device_ids": ["0"]}, "count"),
        ({"name": "j", "devices": ["0"]}, "devices"),  # a typo must not become "every GPU"
    ],
)
def test_it_answers_an_invalid_body_with_422(operator_client, body, field):
    make_node("alpha", 2)
    response = _post(operator_client, "alpha", body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid"
    assert response.json()["error"]["field"] == field
    assert not Claim.objects.exists()


def test_it_lists_claims_fleet_wide_and_per_node(viewer_client, operator):
    claim(make_node("alpha", 2), "train", operator, count=1)
    claim(make_node("beta", 2), "eval", operator, count=1)
    body = viewer_client.get("/api/claims/").json()
    assert [(c["node"], c["name"]) for c in body["results"]] == [("alpha", "train"), ("beta", "eval")]
    body = viewer_client.get("/api/claims/?node=beta").json()
    assert [(c["node"], c["name"]) for c in body["results"]] == [("beta", "eval")]
    body = viewer_client.get("/api/nodes/alpha/claims/").json()
    assert [c["name"] for c in body["results"]] == ["train"]
    assert body["ledger"] == {"total": 2, "reserved": 1, "free": 1, "holders": ["train"]}


@pytest.mark.parametrize("claims", [1, 12])
def test_it_lists_claims_in_fixed_queries(viewer_client, operator, django_assert_num_queries, claims):
    node = make_node("alpha", 2)
    Claim.objects.bulk_create(Claim(node=node, name=f"c{i}", count=1, created_by=operator) for i in range(claims))
    # session, user, user perms, group perms, count, page (with node and creator)
    with django_assert_num_queries(6):
        response = viewer_client.get("/api/claims/")
    assert len(response.json()["results"]) == claims


def test_it_reads_one_claim(viewer_client, operator):
    train = claim(make_node("alpha", 2), "train", operator, count=1)
    assert viewer_client.get(f"/api/claims/{train.pk}/").json()["name"] == "train"
    missing = viewer_client.get("/api/claims/999/")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"


def test_it_replaces_a_claim_with_put_and_audits_before_and_after(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    version = train.updated_at.isoformat()
    response = _put(operator_client, train.pk, {"name": "train", "device_ids": ["0", "1"], "updated_at": version})
    assert response.status_code == 200
    assert (response.json()["mode"], response.json()["device_ids"]) == ("devices", ["0", "1"])
    entry = AuditEntry.objects.get(action="claim.update")
    # The body left owner, contact and window out: the claim keeps its own.
    assert entry.before == {"name": "train", "count": 1, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}
    assert entry.after == {"name": "train", "count": 0, "device_ids": ["0", "1"], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}


def test_it_checks_a_put_against_the_other_claims_only(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=3)
    claim(node, "eval", operator, count=1)
    body = {"name": "train", "count": 3, "updated_at": _version(operator_client, train.pk)}
    assert _put(operator_client, train.pk, body).status_code == 200
    response = _put(operator_client, train.pk, {"name": "train", "count": 4, "updated_at": _version(operator_client, train.pk)})
    assert response.status_code == 409
    assert response.json()["error"] == {"code": "insufficient", "message": "Needs 4 GPUs but only 3 of 4 are free."}


def test_it_refuses_a_stale_put_with_409(operator_client, operator, admin_user):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    loaded = train.updated_at.isoformat()
    services.save_claim(node, gpu.Claim(name="train", count=2), admin_user, editing=train)
    response = _put(operator_client, train.pk, {"name": "train", "count": 3, "updated_at": loaded})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale"
    assert Claim.objects.get(pk=train.pk).count == 2
    current = operator_client.get(f"/api/claims/{train.pk}/").json()["updated_at"]
    assert _put(operator_client, train.pk, {"name": "train", "count": 3, "updated_at": current}).status_code == 200


def test_it_deletes_a_claim_with_204_and_audits(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=2)
    version = train.updated_at.isoformat()
    response = _delete(operator_client, train.pk, version)
    assert response.status_code == 204
    assert not Claim.objects.exists()
    assert Node.objects.get(pk=node.pk).gpus_reserved == 0
    entry = AuditEntry.objects.get(action="claim.delete")
    assert (entry.before, entry.after) == ({"name": "train", "count": 2, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}, None)
    again = _delete(operator_client, train.pk, version)
    assert again.status_code == 404
    assert again.json()["error"] == {"code": "not_found", "message": f"there is no claim {train.pk}: it was deleted, or never existed"}


def test_it_refuses_a_stale_delete_with_409(operator_client, operator, admin_user):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    loaded = train.updated_at.isoformat()
    services.save_claim(node, gpu.Claim(name="train", count=2), admin_user, editing=train)
    response = operator_client.delete(f"/api/claims/{train.pk}/?updated_at={loaded.replace('+', '%2B')}")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale"
    assert Claim.objects.filter(pk=train.pk).exists()


REQUIRED = (
    "The claim's version (updated_at) is required, so that a change made meanwhile is not overwritten; "
    "review the claim as it is now and {action} again."
)
UNREADABLE = (
    "The claim's version (updated_at) is not readable (it must be the claim's updated_at as ISO 8601), "
    "so that a change made meanwhile is not overwritten; review the claim as it is now and {action} again."
)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({}, REQUIRED),
        ({"updated_at": None}, UNREADABLE),
        ({"updated_at": ""}, REQUIRED),
        ({"updated_at": "yesterday"}, UNREADABLE),
        ({"updated_at": 1700000000}, UNREADABLE),
        ({"updated_at": "2025-01-01T10:00:00"}, UNREADABLE),  # no time zone: not one we wrote
    ],
)
def test_it_refuses_a_put_without_a_readable_version_with_428(operator_client, operator, extra, message):
    train = claim(make_node("alpha", 4), "train", operator, count=1)
    before = _unchanged(train)
    response = _put(operator_client, train.pk, {"name": "train", "count": 2, **extra})
    assert response.status_code == 428
    assert response.json() == {
        "error": {"code": "version_required", "message": message.format(action="save"), "field": "updated_at"}
    }
    assert _unchanged(train) == before


@pytest.mark.parametrize(
    "version, message", [(None, REQUIRED), ("", REQUIRED), ("soon", UNREADABLE), ("2025-01-01T10:00:00", UNREADABLE)]
)
def test_it_refuses_a_delete_without_a_readable_version_with_428(operator_client, operator, version, message):
    train = claim(make_node("alpha", 4), "train", operator, count=1)
    before = _unchanged(train)
    response = _delete(operator_client, train.pk, version)
    assert response.status_code == 428
    assert response.json() == {
        "error": {"code": "version_required", "message": message.format(action="delete"), "field": "updated_at"}
    }
    assert _unchanged(train) == before


def test_it_answers_a_write_to_a_deleted_claim_with_404(operator_client, operator):
    train = claim(make_node("alpha", 4), "train", operator, count=1)
    version = train.updated_at.isoformat()
    Claim.objects.filter(pk=train.pk).delete()  # by someone else, before the request came
    expected = {"code": "not_found", "message": f"there is no claim {train.pk}: it was deleted, or never existed"}
    response = _put(operator_client, train.pk, {"name": "train", "count": 2, "updated_at": version})
    assert (response.status_code, response.json()["error"]) == (404, expected)
    response = _delete(operator_client, train.pk, version)
    assert (response.status_code, response.json()["error"]) == (404, expected)
    assert not Claim.objects.exists()
    assert not AuditEntry.objects.filter(action__in=["claim.update", "claim.delete"]).exists()


def test_the_schema_documents_the_version_as_required(viewer_client):
    schema = viewer_client.get("/api/openapi.json").json()
    update = schema["components"]["schemas"]["ClaimUpdate"]
    assert "updated_at" in update["required"]
    assert update["properties"]["updated_at"]["type"] == "string"
    params = schema["paths"]["/api/claims/{pk}/"]["delete"]["parameters"]
    version = next(p for p in params if p["name"] == "updated_at")
    assert (version["in"], version["required"]) == ("query", True)


def test_it_answers_a_claim_deleted_meanwhile_with_404_gone(operator_client, operator, monkeypatch):
    train = claim(make_node("alpha", 4), "train", operator, count=1)
    real_save = services.save_claim

    def deleted_meanwhile(node, proposed, user, editing=None, **kwargs):
        Claim.objects.filter(pk=editing.pk).delete()
        return real_save(node, proposed, user, editing=editing, **kwargs)

    monkeypatch.setattr(services, "save_claim", deleted_meanwhile)
    response = _put(operator_client, train.pk, {"name": "train", "count": 2, "updated_at": train.updated_at.isoformat()})
    assert response.status_code == 404
    assert response.json()["error"] == {"code": "gone", "message": "This claim was deleted by someone else meanwhile."}


def test_it_names_the_field_of_a_validation_error_in_the_error_shape(operator_client):
    make_node("alpha", 2)
    response = _post(operator_client, "alpha", {"name": "j", "count": 1, "device_ids": ["0"]})
    assert response.json() == {
        "error": {"code": "invalid", "message": "count: give either count or device_ids, not both", "field": "count"}
    }


def test_the_claim_list_takes_the_claims_page_s_search(viewer_client, operator):
    alpha, beta = make_node("alpha", 2), make_node("beta", 2)
    claim(alpha, "train-llm", operator, count=1)
    claim(beta, "infer", operator, count=1)
    body = viewer_client.get("/api/claims/", {"q": "llm"}).json()
    assert [c["name"] for c in body["results"]] == ["train-llm"]
    assert [c["node"] for c in viewer_client.get("/api/claims/", {"node": "beta"}).json()["results"]] == ["beta"]
