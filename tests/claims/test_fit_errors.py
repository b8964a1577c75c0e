"""Every ledger outcome, through the real ledger, shown at the field it is about in
the ledger's own words: by the inline validation endpoint and by a refused save."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from tests.claims.helpers import HTMX, all_errors, claim, make_node, uuid

pytestmark = pytest.mark.django_db


def _post(client, node, data, via):
    if via == "validate":
        response = client.post(f"/claims/nodes/{node.name}/validate/", data, **HTMX)
    else:
        response = client.post(f"/claims/nodes/{node.name}/new/", data)
    assert response.status_code == 200
    return response.content.decode()


def _refused(client, node, data, via) -> dict[str, list[str]]:
    before = (Claim.objects.count(), AuditEntry.objects.count())
    errors = all_errors(_post(client, node, data, via))
    assert (Claim.objects.count(), AuditEntry.objects.count()) == before, "a refused claim was stored"
    return errors


both = pytest.mark.parametrize("via", ["validate", "save"])


@both
def test_it_says_the_node_has_no_gpu_above_the_form(operator_client, via):
    node = make_node("empty", 0)
    errors = _refused(operator_client, node, {"name": "job", "mode": "count", "count": "1"}, via)
    assert errors == {"form": ["The node reports no NVIDIA GPU."]}


@both
def test_it_says_gpus_cannot_be_attached_above_the_form(operator_client, via):
    node = make_node("bare", 2, attach="none")
    errors = _refused(operator_client, node, {"name": "job", "mode": "all"}, via)
    assert errors == {
        "form": [
            "The node's GPUs cannot be attached to containers:"
            " Docker has neither the nvidia runtime nor NVIDIA CDI devices."
        ]
    }


@both
def test_it_names_an_unknown_device_at_the_devices(operator_client, via):
    node = make_node("alpha", 2)
    errors = _refused(operator_client, node, {"name": "job", "mode": "devices", "devices": ["GPU-nope"]}, via)
    assert errors == {"devices": ["GPU 'GPU-nope' is not present on the node."]}


@both
def test_it_names_a_device_given_twice_at_the_devices(operator_client, via):
    node = make_node("alpha", 2)
    data = {"name": "job", "mode": "devices", "devices": ["0", uuid(node, 0)]}
    errors = _refused(operator_client, node, data, via)
    assert errors == {"devices": [f"GPU '{uuid(node, 0)}' names GPU 0, which the claim already names."]}


@both
def test_it_says_which_device_is_held_by_whom_at_the_devices(operator_client, operator, via):
    node = make_node("alpha", 4)
    claim(node, "train", operator, device_ids=[uuid(node, 3)])
    data = {"name": "job", "mode": "devices", "devices": [uuid(node, 2), uuid(node, 3)]}
    errors = _refused(operator_client, node, data, via)
    assert errors == {"devices": [f"GPU 3 ('{uuid(node, 3)}') is already reserved by train."]}


@both
def test_it_says_how_many_are_free_of_how_many_at_the_count(operator_client, operator, via):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=6)
    errors = _refused(operator_client, node, {"name": "job", "mode": "count", "count": "3"}, via)
    assert errors == {"count": ["Needs 3 GPUs but only 2 of 8 are free."]}


@both
def test_it_says_who_holds_what_when_all_gpus_are_wanted(operator_client, operator, via):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=1)
    claim(node, "eval", operator, device_ids=["5"])
    errors = _refused(operator_client, node, {"name": "job", "mode": "all"}, via)
    assert errors == {"mode": ["Needs every GPU but 2 of 8 are reserved by eval, train."]}


@both
def test_it_says_pinned_gpus_need_free_ones_too_at_the_devices(operator_client, operator, via):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=3)
    data = {"name": "job", "mode": "devices", "devices": [uuid(node, 0), uuid(node, 1)]}
    errors = _refused(operator_client, node, data, via)
    assert errors == {"devices": ["Needs 2 GPUs but only 1 of 4 is free."]}


@both
def test_it_says_a_name_is_taken_at_the_name(operator_client, operator, via):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    errors = _refused(operator_client, node, {"name": "train", "mode": "count", "count": "1"}, via)
    assert errors == {"name": ["Node alpha already has a claim named 'train'."]}


@both
def test_it_asks_for_a_count_instead_of_reading_a_blank_as_every_gpu(operator_client, via):
    node = make_node("alpha", 4)
    errors = _refused(operator_client, node, {"name": "job", "mode": "count", "count": ""}, via)
    assert errors == {"count": ["Say how many GPUs, or choose “All GPUs”."]}


@both
def test_it_asks_for_a_device_when_none_is_ticked(operator_client, via):
    node = make_node("alpha", 4)
    errors = _refused(operator_client, node, {"name": "job", "mode": "devices"}, via)
    assert errors == {"devices": ["Tick at least one GPU, or choose another option."]}


def test_it_shows_no_error_for_a_claim_that_fits(operator_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=6)
    html = _post(operator_client, node, {"name": "job", "mode": "count", "count": "2"}, "validate")
    assert all_errors(html) == {}
