"""The one place claims change: names unique per node (also when the database
catches a race), devices re-checked on save, every change audited."""

from __future__ import annotations

import pytest

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, field_errors, make_node, shrink_node, uuid

pytestmark = pytest.mark.django_db


def test_it_refuses_a_second_claim_of_the_same_name_on_a_node(operator):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    with pytest.raises(services.NameTaken) as refused:
        claim(node, "train", operator, count=1)
    assert refused.value.code == "name_taken"
    assert refused.value.message == "Node alpha already has a claim named 'train'."
    assert Claim.objects.count() == 1


def test_it_allows_the_same_name_on_another_node(operator):
    claim(make_node("alpha", 2), "train", operator, count=1)
    claim(make_node("beta", 2), "train", operator, count=1)
    assert Claim.objects.filter(name="train").count() == 2


def test_it_turns_a_unique_violation_into_the_same_refusal(operator, monkeypatch):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    # As if another writer inserted the name after the check.
    monkeypatch.setattr(services, "check_name", lambda *args, **kwargs: None)
    with pytest.raises(services.NameTaken):
        claim(node, "train", operator, count=1)
    assert Claim.objects.count() == 1
    assert AuditEntry.objects.filter(action="claim.create").count() == 1


def test_it_shows_a_unique_violation_at_the_name_field(operator_client, operator, monkeypatch):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    monkeypatch.setattr(services, "check_name", lambda *args, **kwargs: None)
    response = operator_client.post("/claims/nodes/alpha/new/", {"name": "train", "mode": "count", "count": "1"})
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "name") == ["Node alpha already has a claim named 'train'."]


def test_it_keeps_the_name_when_an_edit_renames_nothing(operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    saved = services.save_claim(node, gpu.Claim(name="train", count=2), operator, editing=train)
    assert saved.count == 2


def test_it_refuses_a_rename_onto_another_claims_name(operator):
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    evaluation = claim(node, "eval", operator, count=1)
    with pytest.raises(services.NameTaken):
        services.save_claim(node, gpu.Claim(name="train", count=1), operator, editing=evaluation)


def test_it_clears_the_missing_flag_when_a_claim_is_saved_again(operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, device_ids=[uuid(node, 7)])
    node = shrink_node(node, 4)
    train.refresh_from_db()
    assert train.missing_devices == [uuid(node, 7)]
    saved = services.save_claim(node, gpu.Claim(name="train", device_ids=("1",)), operator, editing=train)
    assert saved.missing_devices == []


def test_it_reports_a_claim_deleted_meanwhile(operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    Claim.objects.filter(pk=train.pk).delete()
    with pytest.raises(services.ClaimGone):
        services.save_claim(node, gpu.Claim(name="train", count=2), operator, editing=train)
    with pytest.raises(services.ClaimGone):
        services.delete_claim(train, operator)
