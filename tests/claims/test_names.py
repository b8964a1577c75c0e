"""Claim names: one workload is one name whatever its case, and a name reads as what it is."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, field_errors, make_node

pytestmark = pytest.mark.django_db


def test_it_refuses_a_name_that_differs_only_in_case(operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=1)
    with pytest.raises(services.NameTaken):
        claim(node, "TRAIN", operator, count=1)
    assert list(Claim.objects.values_list("name", flat=True)) == ["train"]


def test_the_database_refuses_it_too_for_a_writer_that_skips_the_service(operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=1)
    with pytest.raises(IntegrityError):
        Claim.objects.create(node=node, name="Train", count=1)


@pytest.mark.parametrize("name", ["train\u202eniart", "a\u2066b", "tab\there", "nul\x00", "\u200ftrain"])
def test_it_refuses_control_and_text_direction_characters(operator, name):
    node = make_node("alpha", 2)
    with pytest.raises(services.BadName) as caught:
        services.save_claim(node, gpu.Claim(name=name, count=1), operator)
    assert caught.value.code == "invalid" and "text-direction" in caught.value.message
    assert not Claim.objects.exists()


def test_the_form_shows_the_bad_name_at_the_name_field(operator_client):
    make_node("alpha", 2)
    response = operator_client.post("/claims/nodes/alpha/new/", {"name": "evil\u202e", "mode": "count", "count": "1"})
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "name") == [
        "The claim name may not hold control or text-direction characters."
    ]
    assert not Claim.objects.exists()


def test_a_name_in_another_script_is_fine(operator):
    node = make_node("alpha", 2)
    assert claim(node, "обучение-模型", operator, count=1).name == "обучение-模型"
