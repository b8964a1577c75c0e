"""Editing a claim: checked against the node's other claims, audited before → after,
and refused (not overwritten) when someone else changed the claim meanwhile."""

from __future__ import annotations

from unittest.mock import ANY

import pytest

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node
from tests.claims.helpers import HTMX, claim, field_errors, hidden_version, make_node, summary, uuid

pytestmark = pytest.mark.django_db


def _edit_form(client, pk) -> tuple[str, str]:
    response = client.get(f"/claims/{pk}/edit/")
    assert response.status_code == 200
    html = response.content.decode()
    return html, hidden_version(html)


def test_it_fills_the_form_with_the_claim_and_its_version(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, device_ids=["1", uuid(node, 2)])
    html, version = _edit_form(operator_client, train.pk)
    assert version == train.updated_at.isoformat()
    assert 'name="name" value="train"' in html
    # Ticked by UUID whichever way the claim named them.
    assert f'value="{uuid(node, 1)}" id="id_devices_1" checked' in html
    assert f'value="{uuid(node, 2)}" id="id_devices_2" checked' in html
    assert 'value="devices" id="id_mode_2" required checked' in html


def test_it_saves_an_edit_and_audits_before_and_after(operator_client, admin_user, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", admin_user, count=2)
    _, version = _edit_form(operator_client, train.pk)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/", {"name": "train", "mode": "count", "count": "5", "updated_at": version}
    )
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"
    train.refresh_from_db()
    assert train.count == 5
    assert Node.objects.get(pk=node.pk).gpus_reserved == 5
    entry = AuditEntry.objects.filter(action="claim.update").get()
    assert (entry.user, entry.target) == (operator, "train")
    assert entry.before == {"name": "train", "count": 2, "device_ids": [], "team": "lab", "owner": "ada", "contact": "", "starts_at": ANY, "ends_at": None}
    # The form posted no owner: the edit gives the claim to nobody, and the audit says so.
    assert entry.after == {"name": "train", "count": 5, "device_ids": [], "team": "lab", "owner": None, "contact": "", "starts_at": ANY, "ends_at": None}


def test_it_keeps_its_own_gpus_when_editing(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=2)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/",
        {
            "name": "train-2",
            "mode": "devices",
            "devices": [uuid(node, 0), uuid(node, 1)],
            "updated_at": train.updated_at.isoformat(),
        },
    )
    assert response.status_code == 302
    train.refresh_from_db()
    assert (train.name, train.device_ids) == ("train-2", [uuid(node, 0), uuid(node, 1)])


def test_it_refuses_an_edit_that_collides_with_another_claim(operator_client, operator):
    node = make_node("alpha", 4)
    train = claim(node, "train", operator, count=1)
    claim(node, "eval", operator, count=2)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/",
        {"name": "train", "mode": "count", "count": "3", "updated_at": train.updated_at.isoformat()},
    )
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "count") == ["Needs 3 GPUs but only 2 of 4 are free."]
    train.refresh_from_db()
    assert train.count == 1


def test_it_refuses_a_stale_edit_instead_of_overwriting(operator_client, operator, admin_user):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    _, loaded = _edit_form(operator_client, train.pk)
    # Someone else saves the claim while the form is open.
    services.save_claim(node, gpu.Claim(name="train", count=4), admin_user, editing=train)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/", {"name": "train", "mode": "count", "count": "3", "updated_at": loaded}
    )
    html = response.content.decode()
    assert response.status_code == 200
    assert field_errors(html, "form") == ["This claim was changed by someone else meanwhile; review and save again."]
    assert "Currently saved: 4 GPUs." in html
    train.refresh_from_db()
    assert train.count == 4, "the other editor's change was overwritten"
    assert AuditEntry.objects.filter(action="claim.update").count() == 1
    # The re-rendered form carries the current version: saving again, reviewed, works.
    current = hidden_version(html)
    assert current == train.updated_at.isoformat() != loaded
    response = operator_client.post(
        f"/claims/{train.pk}/edit/", {"name": "train", "mode": "count", "count": "3", "updated_at": current}
    )
    assert response.status_code == 302
    train.refresh_from_db()
    assert train.count == 3


def test_it_flags_a_stale_edit_while_validating_inline(operator_client, operator, admin_user):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    _, loaded = _edit_form(operator_client, train.pk)
    services.save_claim(node, gpu.Claim(name="train", count=4), admin_user, editing=train)
    response = operator_client.post(
        f"/claims/{train.pk}/validate/", {"name": "train", "mode": "count", "count": "3", "updated_at": loaded}, **HTMX
    )
    html = response.content.decode()
    assert field_errors(html, "form") == ["This claim was changed by someone else meanwhile; review and save again."]
    # Validation does not absorb the other change: the form keeps the loaded version.
    assert hidden_version(html) == loaded


def test_it_refuses_a_stale_edit_that_passed_the_form_check(operator, admin_user):
    """The form's check runs before the lock; save_claim checks again under it."""
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    loaded = train.updated_at
    services.save_claim(node, gpu.Claim(name="train", count=4), admin_user, editing=Claim.objects.get(pk=train.pk))
    with pytest.raises(services.StaleClaim):
        services.save_claim(node, gpu.Claim(name="train", count=3), operator, editing=train, expected_updated_at=loaded)
    assert Claim.objects.get(pk=train.pk).count == 4


def test_it_returns_the_panel_after_an_htmx_edit(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/",
        {"name": "train", "mode": "all", "updated_at": train.updated_at.isoformat(), "in_panel": "1"},
        **HTMX,
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert summary(html) == {"total": "8", "reserved": "8", "free": "0", "holders": "train"}


def test_it_gives_htmx_the_edit_form_for_the_panel(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    response = operator_client.get(f"/claims/{train.pk}/edit/?in_panel=1", **HTMX)
    html = response.content.decode()
    assert html.lstrip().startswith('<form id="claim-form"')
    assert f'hx-post="/claims/{train.pk}/edit/" hx-target="#claims-panel"' in html
    assert f'hx-post="/claims/{train.pk}/validate/"' in html
    assert 'hx-get="/claims/nodes/alpha/panel/"' in html  # Cancel puts the add form back


def test_it_is_404_for_a_claim_that_is_gone(operator_client):
    make_node("alpha", 2)
    assert operator_client.get("/claims/999/edit/").status_code == 404
    # A save that does not say its node cannot tell deleted from never there; it says both.
    response = operator_client.post("/claims/999/edit/", {"name": "x", "mode": "all"})
    assert response.status_code == 404
    html = response.content.decode()
    assert "This claim was deleted by someone else meanwhile, or never existed." in html
    assert 'href="/claims/"' in html


REQUIRED = (
    "The claim's version (updated_at) is required, so that a change made meanwhile is not overwritten; "
    "review the claim as it is now and save again."
)
UNREADABLE = (
    "The claim's version (updated_at) is not readable (it must be the claim's updated_at as ISO 8601), "
    "so that a change made meanwhile is not overwritten; review the claim as it is now and save again."
)


def _row(train: Claim) -> tuple:
    """The stored claim and the audit log: what a refused save must leave untouched."""
    row = Claim.objects.filter(pk=train.pk).values("name", "count", "device_ids", "owner", "updated_at").get()
    return row, AuditEntry.objects.count()


@pytest.mark.parametrize(
    "version, message",
    [(None, REQUIRED), ("", REQUIRED), ("   ", REQUIRED), ("yesterday", UNREADABLE), ("2025-01-01T10:00:00", UNREADABLE)],
)
def test_it_refuses_an_edit_without_a_readable_version(operator_client, operator, version, message):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    before = _row(train)
    body = {"name": "train", "mode": "count", "count": "5", "node": "alpha"}
    if version is not None:
        body["updated_at"] = version
    response = operator_client.post(f"/claims/{train.pk}/edit/", body)
    html = response.content.decode()
    assert response.status_code == 400
    assert field_errors(html, "form") == [message]
    assert _row(train) == before, "a save without the version was written"
    # The form comes back with the claim's current version: saving again, reviewed, works.
    current = hidden_version(html)
    assert current == train.updated_at.isoformat()
    response = operator_client.post(f"/claims/{train.pk}/edit/", {**body, "updated_at": current})
    assert response.status_code == 302
    assert Claim.objects.get(pk=train.pk).count == 5


def test_it_refuses_an_htmx_edit_without_a_version_in_the_panel(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    before = _row(train)
    response = operator_client.post(
        f"/claims/{train.pk}/edit/", {"name": "train", "mode": "count", "count": "5", "in_panel": "1"}, **HTMX
    )
    html = response.content.decode()
    # 200: htmx 2 does not swap a 4xx body, and the user must see why nothing was saved.
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert field_errors(html, "form") == [REQUIRED]
    assert hidden_version(html) == train.updated_at.isoformat()
    assert _row(train) == before
    assert "HX-Trigger" not in response


def test_it_flags_a_missing_version_while_validating_inline(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    response = operator_client.post(f"/claims/{train.pk}/validate/", {"name": "train", "mode": "count", "count": "3"}, **HTMX)
    assert field_errors(response.content.decode(), "form") == [REQUIRED]


def test_the_edit_form_carries_the_version_and_the_node(operator_client, operator):
    node = make_node("alpha", 2)
    train = claim(node, "train", operator, count=1)
    html, version = _edit_form(operator_client, train.pk)
    assert version == train.updated_at.isoformat()
    assert '<input type="hidden" name="node" value="alpha">' in html
    panel = operator_client.get("/claims/nodes/alpha/panel/", **HTMX).content.decode()
    assert f'hx-get="/claims/{train.pk}/edit/?in_panel=1&amp;node=alpha"' in panel


DELETED = "This claim was deleted by someone else meanwhile."


def test_it_says_a_claim_was_deleted_meanwhile_on_a_plain_save(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    _, version = _edit_form(operator_client, train.pk)
    Claim.objects.filter(pk=train.pk).delete()  # someone else, while the form was open
    body = {"name": "train", "mode": "count", "count": "3", "updated_at": version, "node": "alpha"}
    response = operator_client.post(f"/claims/{train.pk}/edit/", body)
    assert response.status_code == 302
    assert response["Location"] == "/nodes/alpha/"
    page = operator_client.get(response["Location"]).content.decode()
    assert DELETED in page
    assert not Claim.objects.exists()
    assert not AuditEntry.objects.filter(action="claim.update").exists()


def test_it_says_a_claim_was_deleted_meanwhile_on_an_htmx_save(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    claim(node, "eval", operator, count=1)
    version = train.updated_at.isoformat()
    Claim.objects.filter(pk=train.pk).delete()
    body = {"name": "train", "mode": "count", "count": "3", "updated_at": version, "node": "alpha", "in_panel": "1"}
    response = operator_client.post(f"/claims/{train.pk}/edit/", body, **HTMX)
    html = response.content.decode()
    # Not a 404, which htmx would drop silently, leaving the form as if nothing happened.
    assert response.status_code == 200
    assert (response["HX-Retarget"], response["HX-Reswap"]) == ("#claims-panel", "outerHTML")
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert f'<p class="claims-notice" role="status">{DELETED}</p>' in html.replace("&#x27;", "'")
    assert 'href="/claims/?node=alpha"' in html  # the way to the node's claims
    assert summary(html)["holders"] == "eval"
    assert not Claim.objects.filter(name="train").exists()


def test_it_says_a_claim_was_deleted_meanwhile_when_its_edit_link_is_followed(operator_client, operator):
    node = make_node("alpha", 8)
    train = claim(node, "train", operator, count=2)
    Claim.objects.filter(pk=train.pk).delete()
    response = operator_client.get(f"/claims/{train.pk}/edit/?in_panel=1&node=alpha", **HTMX)
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#claims-panel"  # the Edit link targets the form only
    assert DELETED in response.content.decode()


def test_it_says_deleted_meanwhile_to_htmx_without_a_node(operator_client):
    make_node("alpha", 2)
    response = operator_client.post("/claims/999/edit/", {"name": "x", "mode": "all", "in_panel": "1"}, **HTMX)
    html = response.content.decode()
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#claims-panel"
    assert html.lstrip().startswith('<section id="claims-panel"')
    assert "This claim was deleted by someone else meanwhile, or never existed." in html


def test_it_keeps_a_vanished_gpu_ticked_so_the_ledger_can_name_it(operator_client, operator):
    from tests.claims.helpers import shrink_node

    node = make_node("alpha", 8)
    train = claim(node, "train", operator, device_ids=[uuid(node, 1), uuid(node, 6)])
    shrink_node(node, 4)
    html, version = _edit_form(operator_client, train.pk)
    assert f"{uuid(node, 6)} · no longer reported by the node" in html
    response = operator_client.post(
        f"/claims/{train.pk}/edit/",
        {"name": "train", "mode": "devices", "devices": [uuid(node, 1), uuid(node, 6)], "updated_at": version},
    )
    assert field_errors(response.content.decode(), "devices") == [f"GPU '{uuid(node, 6)}' is not present on the node."]
