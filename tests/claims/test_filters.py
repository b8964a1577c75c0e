"""ClaimFilter on its own, as the API uses it: node, search, and an invalid value
as an error with nothing listed."""

from __future__ import annotations

import pytest
from django.http import QueryDict

from gpufleet.claims.filters import ClaimFilter
from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(operator):
    alpha, beta = make_node("alpha", 8), make_node("beta", 4)
    make_node("gamma", 2)  # holds no claim
    claim(alpha, "train", operator, count=2)
    claim(alpha, "eval", operator, device_ids=["7"])
    claim(beta, "train-big", operator, count=1)


def _rows(query: str) -> list[tuple[str, str]]:
    rows = ClaimFilter(QueryDict(query), queryset=Claim.objects.order_by("node__name", "name")).qs
    return [(row.node.name, row.name) for row in rows.select_related("node")]


def test_it_filters_by_node_and_searches_claim_and_node_names(fleet):
    assert _rows("node=alpha") == [("alpha", "eval"), ("alpha", "train")]
    assert _rows("q=TRAIN") == [("alpha", "train"), ("beta", "train-big")]
    assert _rows("q=bet") == [("beta", "train-big")]
    assert _rows("node=alpha&q=train") == [("alpha", "train")]
    assert _rows("node=&q=") == [("alpha", "eval"), ("alpha", "train"), ("beta", "train-big")]


def test_it_keeps_a_bookmarked_node_without_claims(fleet):
    claim_filter = ClaimFilter(QueryDict("node=gone"), queryset=Claim.objects.all())
    assert claim_filter.is_valid() and list(claim_filter.qs) == []
    field = str(claim_filter.form["node"])
    # A text box keeping the asked name: a choice of the nodes holding claims grows with
    # the fleet (thousands of options drawn on every view).
    assert 'type="text"' in field and 'value="gone"' in field
    assert "<option" not in field and "alpha" not in field


def test_it_lists_nothing_for_an_invalid_search(fleet):
    claim_filter = ClaimFilter(QueryDict("node=alpha&q=" + "x" * 201), queryset=Claim.objects.all())
    assert not claim_filter.is_valid()
    assert list(claim_filter.errors) == ["q"]
    assert list(claim_filter.qs) == []
    assert claim_filter.error_messages() == ["q: Ensure this value has at most 200 characters (it has 201)."]
