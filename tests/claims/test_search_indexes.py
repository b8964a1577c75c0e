"""The claims list's search (a part of the claim's or the node's name) can be answered from
the trigram indexes of claim names (claims 0002) and node names (fleet 0003) instead of
reading every claim and every node of the fleet."""

from __future__ import annotations

import pytest
from django.db import connection
from django.http import QueryDict

from gpufleet.claims.filters import ClaimFilter
from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def _plan(queryset) -> str:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        # The tables are tiny here: without these the planner reads them whole, or walks
        # another index end to end, either of which is cheaper than a trigram index for a
        # few rows (in CI, with what the suite's other tests left in statistics, it did).
        # With both off, what can answer a substring search is the trigram index or nothing.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgresql
def test_the_search_reads_the_trigram_indexes_of_claim_and_node_names(operator):
    claim(make_node("alpha", 2), "train", operator, count=1)
    found = ClaimFilter(QueryDict("q=rai"), queryset=Claim.objects.order_by("node__name", "name")).qs
    plan = _plan(found)
    assert "claim_name_trgm" in plan
    assert "node_name_trgm" in plan
    assert "Seq Scan" not in plan


def test_the_search_finds_by_claim_or_node_name_once_each(operator):
    alpha = make_node("alpha-train", 2)
    claim(alpha, "train", operator, count=1)
    claim(make_node("beta", 2), "trainer", operator, count=1)
    claim(alpha, "eval", operator, count=1)
    found = ClaimFilter(QueryDict("q=TRAIN"), queryset=Claim.objects.order_by("node__name", "name")).qs
    assert [(c.node.name, c.name) for c in found] == [("alpha-train", "eval"), ("alpha-train", "train"), ("beta", "trainer")]
