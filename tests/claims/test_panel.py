"""The claims panel of the node page: ledger summary, claims (missing GPUs flagged),
controls only for editors, recent claim audit rows, and a fixed number of queries."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory

from gpufleet.claims.views import claims_panel_context
from tests.claims.helpers import HTMX, claim, make_node, shrink_node, summary, uuid

pytestmark = pytest.mark.django_db


def _panel(client, name="alpha") -> str:
    response = client.get(f"/claims/nodes/{name}/panel/", **HTMX)
    assert response.status_code == 200
    return response.content.decode()


def test_it_sums_up_the_ledger(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=3)
    claim(node, "eval", operator, device_ids=["6", "7"])
    assert summary(_panel(viewer_client)) == {"total": "8", "reserved": "5", "free": "3", "holders": "eval, train"}


def test_it_sums_up_an_all_gpu_claim_as_everything_reserved(viewer_client, operator):
    node = make_node("alpha", 4)
    claim(node, "everything", operator)
    assert summary(_panel(viewer_client)) == {"total": "4", "reserved": "4", "free": "0", "holders": "everything"}


def test_it_says_none_when_nothing_is_held(viewer_client):
    make_node("alpha", 2)
    html = _panel(viewer_client)
    assert summary(html) == {"total": "2", "reserved": "0", "free": "2", "holders": "none"}
    assert "No claims on this node: all 2 GPUs free." in html


def test_it_shows_viewers_the_claims_without_controls(viewer_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    html = _panel(viewer_client)
    assert '<th scope="row">train</th>' in html
    assert f"/claims/{train.pk}/edit/" not in html
    assert f"/claims/{train.pk}/delete/" not in html
    assert 'id="claim-form"' not in html


def test_it_shows_editors_the_controls_and_the_add_form(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    html = _panel(operator_client)
    assert f'href="/claims/{train.pk}/edit/"' in html
    assert f'href="/claims/{train.pk}/delete/"' in html
    assert '<form id="claim-form"' in html
    assert 'hx-post="/claims/nodes/alpha/new/" hx-target="#claims-panel"' in html


def test_it_flags_claims_whose_gpus_vanished(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, device_ids=[uuid(node, 1), uuid(node, 6)])
    shrink_node(node, 4)
    html = _panel(viewer_client)
    assert html.count('class="claims-has-missing"') == 1
    assert "⚠ 1 GPU no longer reported" in html
    assert f'title="no longer reported by the node">{uuid(node, 6)} (missing)</span>' in html
    assert f'title="{uuid(node, 1)}">GPU 1</span>' in html


def test_it_shows_the_recent_claim_changes_and_links_the_audit_log(viewer_client, operator):
    node = make_node("alpha", 8)
    claim(node, "train", operator, count=2)
    html = _panel(viewer_client)
    assert "otto claim.create" in html
    assert "<strong>train</strong>:\n        — → train: 2 GPUs" in html
    assert '<a href="/audit/?node=alpha">Full audit log</a>' in html


def test_it_sends_people_without_htmx_to_the_node_page(viewer_client):
    make_node("alpha", 2)
    response = viewer_client.get("/claims/nodes/alpha/panel/")
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"


def test_it_refuses_the_panel_to_outsiders(outsider):
    node = make_node("alpha", 2)
    request = RequestFactory().get("/nodes/alpha/")
    request.user = outsider
    with pytest.raises(PermissionDenied):
        claims_panel_context(request, node)


def test_it_keeps_the_keys_the_node_page_reads(viewer):
    node = make_node("alpha", 2)
    claim(node, "train", None, device_ids=["1"])
    request = RequestFactory().get("/nodes/alpha/")
    request.user = viewer
    context = claims_panel_context(request, node)
    assert context["ledger"].reserved == 1
    assert [context["ledger"].holder_of(i) for i in (0, 1)] == [None, "train"]
    assert context["claim_form"] is None  # a viewer gets no form


@pytest.mark.parametrize("gpus", [2, 8])
def test_it_renders_the_panel_in_fixed_queries(operator_client, operator, django_assert_num_queries, gpus):
    node = make_node("alpha", gpus)
    claim(node, "train", operator, count=1)
    claim(node, "eval", operator, device_ids=["0"])
    # session, user, user perms, group perms, node, the operator's teams (rights), the teams
    # to book for (the form's), devices, claims, their teams, audit entries (the owner is a
    # user name typed: no list of the site's users)
    with django_assert_num_queries(11):
        _panel(operator_client)
