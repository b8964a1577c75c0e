"""The claims list's "New claim" button: to the claim form of the node the list is
filtered by, else to "find a node" (a claim is always made on one node); shown only
to those who may edit claims."""

from __future__ import annotations

import re

import pytest

from tests.claims.helpers import HTMX, claim, make_node

pytestmark = pytest.mark.django_db

NEW_CLAIM = re.compile(r'<a class="button primary" href="([^"]+)"[^>]*>New claim</a>')


@pytest.fixture
def alpha(operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=2)
    return node


def test_it_offers_a_new_claim_on_the_node_the_list_shows(operator_client, alpha):
    assert NEW_CLAIM.findall(operator_client.get("/claims/?node=alpha").content.decode()) == ["/claims/nodes/alpha/new/"]


def test_without_a_node_it_finds_one_first(operator_client, alpha):
    assert NEW_CLAIM.findall(operator_client.get("/claims/").content.decode()) == ["/claims/find/"]


def test_the_table_htmx_swaps_in_brings_its_own_button(operator_client, alpha):
    html = operator_client.get("/claims/?node=alpha", **HTMX).content.decode()
    assert NEW_CLAIM.findall(html) == ["/claims/nodes/alpha/new/"]


def test_the_button_opens_the_claim_form(operator_client, alpha):
    response = operator_client.get("/claims/nodes/alpha/new/")
    assert response.status_code == 200 and "New claim on alpha" in response.content.decode()


def test_a_viewer_gets_no_button(viewer_client, alpha):
    assert NEW_CLAIM.findall(viewer_client.get("/claims/").content.decode()) == []


def test_a_node_filter_no_url_takes_finds_a_node_instead(operator_client, alpha):
    response = operator_client.get("/claims/", {"node": "a/b"})
    assert response.status_code == 200
    assert NEW_CLAIM.findall(response.content.decode()) == ["/claims/find/"]
