"""Adding a claim: HTMX gets the re-rendered panel, a plain form post is redirected
to the node page (PRG) and an invalid one re-renders the page with its errors."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import HTMX, claim, field_errors, make_node, summary, uuid

pytestmark = pytest.mark.django_db


def test_it_redirects_after_a_plain_post_and_stores_the_claim(operator_client, operator):
    make_node("alpha", 8)
    response = operator_client.post("/claims/nodes/alpha/new/", {"name": "train", "mode": "count", "count": "3"})
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"
    saved = Claim.objects.get(node__name="alpha", name="train")
    assert (saved.count, saved.device_ids, saved.created_by) == (3, [], operator)
    assert Node.objects.get(name="alpha").gpus_reserved == 3


def test_it_audits_who_added_what(operator_client, operator):
    make_node("alpha", 8)
    operator_client.post(
        "/claims/nodes/alpha/new/", {"name": "train", "mode": "count", "count": "3", "owner": operator.username}
    )
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.username, entry.action, entry.node_name, entry.target) == (
        operator,
        "otto",
        "claim.create",
        "alpha",
        "train",
    )
    assert entry.before is None
    assert entry.after == {"name": "train", "count": 3, "device_ids": [], "team": "lab", "owner": "otto", "contact": "", "starts_at": ANY, "ends_at": None}


def test_it_stores_all_gpus_as_count_zero_and_chosen_gpus_by_uuid(operator_client):
    node = make_node("alpha", 4)
    operator_client.post("/claims/nodes/alpha/new/", {"name": "all", "mode": "all", "count": "2"})
    everything = Claim.objects.get(name="all")
    assert (everything.count, everything.device_ids) == (0, [])
    Claim.objects.all().delete()
    operator_client.post(
        "/claims/nodes/alpha/new/",
        {"name": "pin", "mode": "devices", "count": "3", "devices": [uuid(node, 1), uuid(node, 2)]},
    )
    pinned = Claim.objects.get(name="pin")
    assert (pinned.count, pinned.device_ids) == (0, [uuid(node, 1), uuid(node, 2)])


def test_it_returns_the_updated_panel_to_htmx(operator_client, operator):
    node = make_node("alpha", 8)
    claim(node, "eval", operator, device_ids=["7"])
    response = operator_client.post(
        "/claims/nodes/alpha/new/", {"name": "train", "mode": "count", "count": "3", "in_panel": "1"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert "<html" not in html
    assert "HX-Request" in response["Vary"]
    assert summary(html) == {"total": "8", "reserved": "4", "free": "4", "holders": "eval, train"}
    assert "Claim train added: 3 GPUs." in html
    assert json.loads(response["HX-Trigger"]) == {"claims-changed": {}}
    # A fresh, empty add form for the next claim.
    assert field_errors(html, "name") == []
    assert 'name="name" value="train"' not in html


def test_it_re_renders_the_panel_with_errors_for_htmx(operator_client, operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=2)
    response = operator_client.post(
        "/claims/nodes/alpha/new/", {"name": "job", "mode": "count", "count": "1", "in_panel": "1"}, **HTMX
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert field_errors(html, "count") == ["Needs 1 GPU but only 0 of 2 are free."]
    assert 'name="name" value="job"' in html
    assert not Claim.objects.filter(name="job").exists()
    assert "HX-Trigger" not in response


def test_it_re_renders_the_whole_page_with_errors_without_javascript(operator_client, operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, count=2)
    response = operator_client.post("/claims/nodes/alpha/new/", {"name": "job", "mode": "count", "count": "1"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html
    assert field_errors(html, "count") == ["Needs 1 GPU but only 0 of 2 are free."]
    assert 'hx-target="#claims-panel"' not in html, "the stand-alone page has no panel to swap"
    assert not Claim.objects.filter(name="job").exists()


def test_it_shows_the_add_page_and_its_form_fragment(operator_client):
    node = make_node("alpha", 2)
    page = operator_client.get("/claims/nodes/alpha/new/")
    assert page.status_code == 200
    assert "<html" in page.content.decode()
    assert "New claim on alpha" in page.content.decode()
    fragment = operator_client.get("/claims/nodes/alpha/new/?in_panel=1", **HTMX)
    html = fragment.content.decode()
    assert html.lstrip().startswith('<form id="claim-form"')
    assert "HX-Request" in fragment["Vary"]
    # Each GPU's checkbox names its index, model and UUID and who holds it.
    assert f"GPU 1 · NVIDIA H200 · {uuid(node, 1)} · not pinned" in html


def test_it_labels_each_gpu_with_its_current_holder(operator_client, operator):
    node = make_node("alpha", 2)
    claim(node, "train", operator, device_ids=["1"])
    html = operator_client.get("/claims/nodes/alpha/new/").content.decode()
    assert f"GPU 1 · NVIDIA H200 · {uuid(node, 1)} · held by train" in html
    assert f"GPU 0 · NVIDIA H200 · {uuid(node, 0)} · not pinned" in html
