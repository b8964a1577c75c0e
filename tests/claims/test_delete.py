"""Deleting a claim: a POST with confirmation (hx-confirm, or a confirmation page
without JavaScript), audited, refused when the claim changed meanwhile."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import HTMX, claim, make_node, summary

pytestmark = pytest.mark.django_db


def test_it_asks_for_confirmation_on_a_page_without_javascript(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    response = operator_client.get(f"/claims/{train.pk}/delete/")
    html = response.content.decode()
    assert response.status_code == 200
    assert "Delete claim train on alpha?" in html
    assert '<input type="hidden" name="confirm" value="yes">' in html
    assert Claim.objects.filter(pk=train.pk).exists()


def test_it_does_not_delete_on_a_post_without_confirmation(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    response = operator_client.post(f"/claims/{train.pk}/delete/")
    assert response.status_code == 200
    assert "Delete claim train on alpha?" in response.content.decode()
    assert Claim.objects.filter(pk=train.pk).exists()
    assert not AuditEntry.objects.filter(action="claim.delete").exists()


def test_it_deletes_redirects_and_audits(operator_client, operator, admin_user):
    node = make_node("alpha", 4)
    train = claim(node, "train", admin_user, device_ids=["2"])
    response = operator_client.post(
        f"/claims/{train.pk}/delete/", {"confirm": "yes", "updated_at": train.updated_at.isoformat()}
    )
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"
    assert not Claim.objects.filter(pk=train.pk).exists()
    assert Node.objects.get(pk=node.pk).gpus_reserved == 0
    entry = AuditEntry.objects.get(action="claim.delete")
    assert (entry.user, entry.node_name, entry.target) == (operator, "alpha", "train")
    assert entry.before == {"name": "train", "count": 0, "device_ids": ["2"], "team": "lab", "owner": "ada", "contact": "", "starts_at": ANY, "ends_at": None}
    assert entry.after is None


def test_it_returns_the_updated_panel_to_htmx(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=3)
    claim(node, "eval", operator, count=1)
    response = operator_client.post(
        f"/claims/{train.pk}/delete/",
        {"confirm": "yes", "in_panel": "1", "updated_at": train.updated_at.isoformat()},
        **HTMX,
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert summary(html) == {"total": "4", "reserved": "1", "free": "3", "holders": "eval"}
    assert "Claim train deleted." in html
    assert json.loads(response["HX-Trigger"]) == {"claims-changed": {}}


def test_it_refuses_to_delete_a_claim_changed_meanwhile(operator_client, operator, admin_user):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    loaded = train.updated_at.isoformat()
    services.save_claim(node, gpu.Claim(name="train", count=2), admin_user, editing=train)
    response = operator_client.post(f"/claims/{train.pk}/delete/", {"confirm": "yes", "updated_at": loaded})
    html = response.content.decode()
    assert response.status_code == 200
    assert "This claim was changed by someone else meanwhile; review and delete again." in html
    assert "It reserves 2 GPUs." in html
    assert Claim.objects.filter(pk=train.pk).exists()
    response = operator_client.post(
        f"/claims/{train.pk}/delete/", {"confirm": "yes", "in_panel": "1", "updated_at": loaded}, **HTMX
    )
    assert "review and delete again" in response.content.decode()
    assert Claim.objects.filter(pk=train.pk).exists()


def test_it_offers_delete_with_hx_confirm_and_a_real_href(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    html = operator_client.get("/claims/nodes/alpha/panel/", **HTMX).content.decode()
    assert f'<a href="/claims/{train.pk}/delete/" class="claims-danger"' in html
    assert f'hx-post="/claims/{train.pk}/delete/"' in html
    assert 'hx-confirm="Delete claim train on alpha?"' in html
