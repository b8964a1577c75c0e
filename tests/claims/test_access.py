"""Who may touch claims: viewers in no team see them but every claims POST is 403 for them
and for outsiders; the operator and the admin of team lab may edit its claims (the
whole matrix of rights: test_rights.py)."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.claims.models import Claim
from tests.claims.helpers import HTMX, claim, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def outsider_client(outsider):
    from django.test import Client

    client = Client()
    client.force_login(outsider)
    return client


@pytest.fixture
def train(operator):
    node = make_node("alpha", 4)
    return claim(node, "train", operator, count=1)


def _posts(train):
    body = {"name": "x", "mode": "count", "count": "1", "confirm": "yes", "updated_at": train.updated_at.isoformat()}
    return [
        ("/claims/nodes/alpha/new/", body),
        ("/claims/nodes/alpha/validate/", body),
        (f"/claims/{train.pk}/edit/", body),
        (f"/claims/{train.pk}/validate/", body),
        (f"/claims/{train.pk}/delete/", body),
    ]


@pytest.mark.parametrize("persona", ["viewer_client", "outsider_client"])
@pytest.mark.parametrize("htmx", [False, True])
def test_it_refuses_every_claims_post_to_non_editors(request, train, persona, htmx):
    client = request.getfixturevalue(persona)
    for url, body in _posts(train):
        response = client.post(url, body, **(HTMX if htmx else {}))
        assert response.status_code == 403, url
    assert list(Claim.objects.values_list("name", "count")) == [("train", 1)]
    assert AuditEntry.objects.filter(username__in=["vera", "olga"]).count() == 0


@pytest.mark.parametrize("persona", ["viewer_client", "outsider_client"])
def test_it_refuses_the_editor_pages_to_non_editors(request, train, persona):
    client = request.getfixturevalue(persona)
    for url in ["/claims/nodes/alpha/new/", f"/claims/{train.pk}/edit/", f"/claims/{train.pk}/delete/"]:
        assert client.get(url).status_code == 403, url


def test_it_refuses_the_list_and_panel_to_outsiders(outsider_client, train):
    assert outsider_client.get("/claims/").status_code == 403
    assert outsider_client.get("/claims/nodes/alpha/panel/", **HTMX).status_code == 403


def test_it_lets_viewers_read_the_list_and_panel(viewer_client, train):
    assert viewer_client.get("/claims/").status_code == 200
    assert viewer_client.get("/claims/nodes/alpha/panel/", **HTMX).status_code == 200


@pytest.mark.parametrize("persona", ["operator_client", "admin_role_client"])
def test_it_lets_operators_and_admins_edit(request, train, persona):
    client = request.getfixturevalue(persona)
    body = {"name": "train", "mode": "count", "count": "2", "updated_at": train.updated_at.isoformat()}
    assert client.post(f"/claims/{train.pk}/edit/", body).status_code == 302
    assert Claim.objects.get(pk=train.pk).count == 2


def test_it_sends_anonymous_htmx_posts_to_the_login_page(client, train):
    response = client.post("/claims/nodes/alpha/new/", {"name": "x", "mode": "all"}, **HTMX)
    assert response.status_code == 200  # htmx follows HX-Redirect, never swaps the body
    assert response["HX-Redirect"].startswith("/accounts/login/")
    assert Claim.objects.count() == 1
