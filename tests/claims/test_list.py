"""The fleet-wide claims list: node filter, search, pages, missing GPUs flagged,
an HTMX fragment, and a fixed number of queries whatever the fleet size."""

from __future__ import annotations

import re

import pytest

from gpufleet.claims.models import Claim
from tests.claims.helpers import HTMX, claim, make_node, shrink_node, uuid

pytestmark = pytest.mark.django_db


def _rows(html: str) -> list[tuple[str, str]]:
    """(node, claim) per table row."""
    return re.findall(r'<td[^>]*><a href="/nodes/[^"]+/">([^<]+)</a></td>\s*<th scope="row">([^<]+)</th>', html)


@pytest.fixture
def fleet(operator):
    alpha, beta = make_node("alpha", 8), make_node("beta", 4)
    claim(alpha, "train", operator, count=2)
    claim(alpha, "eval", operator, device_ids=["7"])
    claim(beta, "train-big", operator, count=1)
    return alpha, beta


def test_it_lists_every_claim_by_node_then_name(viewer_client, fleet):
    response = viewer_client.get("/claims/")
    assert response.status_code == 200
    assert _rows(response.content.decode()) == [("alpha", "eval"), ("alpha", "train"), ("beta", "train-big")]


def test_it_filters_by_node(viewer_client, fleet):
    html = viewer_client.get("/claims/?node=beta").content.decode()
    assert _rows(html) == [("beta", "train-big")]
    assert 'name="node" value="beta"' in html


def test_it_searches_claim_and_node_names(viewer_client, fleet):
    assert _rows(viewer_client.get("/claims/?q=TRAIN").content.decode()) == [("alpha", "train"), ("beta", "train-big")]
    assert _rows(viewer_client.get("/claims/?q=bet").content.decode()) == [("beta", "train-big")]
    assert "0 claims matching “nothing”." in viewer_client.get("/claims/?q=nothing").content.decode()


def test_it_pages_and_keeps_the_filter_in_the_page_links(viewer_client, operator):
    node = make_node("alpha", 8)
    Claim.objects.bulk_create(Claim(node=node, name=f"job-{i:03}", count=0) for i in range(55))
    first = viewer_client.get("/claims/?q=job").content.decode()
    assert len(_rows(first)) == 50
    assert "Page 1 of 2" in first
    assert 'href="?q=job&amp;page=2"' in first
    second = viewer_client.get("/claims/?q=job&page=2").content.decode()
    assert [name for _, name in _rows(second)] == [f"job-{i:03}" for i in range(50, 55)]


def test_it_flags_claims_with_missing_gpus(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, device_ids=[uuid(node, 7)])
    claim(node, "eval", operator, device_ids=["1"])
    shrink_node(node, 4)
    html = viewer_client.get("/claims/").content.decode()
    assert html.count('class="claims-has-missing"') == 1
    assert f"⚠ missing: {uuid(node, 7)}" in html


def test_it_shows_an_invalid_search_at_its_field_and_lists_nothing(viewer_client, fleet):
    response = viewer_client.get("/claims/?node=alpha&q=" + "x" * 201)
    html = response.content.decode()
    assert response.status_code == 200
    assert _rows(html) == []
    assert 'aria-invalid="true" aria-describedby="id_q_error" id="id_q"' in html
    assert '<span id="id_q_error" class="error">Ensure this value has at most 200 characters (it has 201).</span>' in html
    assert "<li>Search: Ensure this value has at most 200 characters (it has 201).</li>" in html
    assert 'name="node" value="alpha"' in html  # the valid field is kept in the form


def test_it_sends_filter_errors_with_the_htmx_table(viewer_client, fleet):
    html = viewer_client.get("/claims/?q=" + "x" * 201, **HTMX).content.decode()
    assert html.lstrip().startswith('<div id="claims-table">')
    assert "<li>Search: Ensure this value has at most 200 characters (it has 201).</li>" in html
    assert '<span id="id_q_error" class="error" hx-swap-oob="true">Ensure this value' in html
    assert '<span id="id_node_error" class="error" hx-swap-oob="true"></span>' in html


def test_it_keeps_a_bookmarked_node_without_claims(viewer_client, fleet):
    html = viewer_client.get("/claims/?node=gone").content.decode()
    assert _rows(html) == [] and "0 claims on gone." in html
    assert 'name="node" value="gone"' in html


def test_it_gives_htmx_the_table_fragment(viewer_client, fleet):
    response = viewer_client.get("/claims/?node=alpha", **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="claims-table">')
    assert "<html" not in html
    assert "HX-Request" in response["Vary"]
    assert _rows(html) == [("alpha", "eval"), ("alpha", "train")]


def test_it_shows_edit_links_to_editors_only(viewer_client, operator_client, fleet):
    pk = Claim.objects.get(name="eval").pk
    assert f'href="/claims/{pk}/edit/"' not in viewer_client.get("/claims/").content.decode()
    assert f'href="/claims/{pk}/edit/"' in operator_client.get("/claims/").content.decode()


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (6, 9)])
def test_it_lists_in_fixed_queries(viewer_client, operator, django_assert_num_queries, nodes, per_node):
    for n in range(nodes):
        node = make_node(f"node-{n}", 4)
        Claim.objects.bulk_create(Claim(node=node, name=f"c{i}", count=1, created_by=operator) for i in range(per_node))
    # session, user, user perms, group perms, the viewer's teams (rights), the viewer's own
    # claims starting or ending soon, count, page (with node, team, creator and owner), owner
    # names; never the names of the nodes holding claims
    with django_assert_num_queries(9):
        response = viewer_client.get("/claims/")
    html = response.content.decode()
    assert len(_rows(html)) == min(50, nodes * per_node)
    assert '<option value="node-0"' not in html
    # The fragment does not draw the form or the reminders, so it skips the owner names and those.
    with django_assert_num_queries(7):
        response = viewer_client.get("/claims/?node=node-0", **HTMX)
    assert len(_rows(response.content.decode())) == per_node


@pytest.mark.parametrize("nodes, per_node", [(1, 2), (6, 4)])
def test_it_names_pinned_gpus_in_fixed_queries(viewer_client, operator, django_assert_num_queries, nodes, per_node):
    for n in range(nodes):
        node = make_node(f"node-{n}", 4)
        Claim.objects.bulk_create(Claim(node=node, name=f"c{i}", device_ids=[uuid(node, i)], created_by=operator)
                                  for i in range(per_node))
    # As above, and the current GPUs of the listed nodes, once for the page.
    with django_assert_num_queries(10):
        response = viewer_client.get("/claims/")
    html = response.content.decode()
    assert len(_rows(html)) == nodes * per_node and html.count(">GPU 0</span>") == nodes
