"""The token row itself: how it reads, and its admin page (read-only: a token is made by
its user on the tokens page, the one place its secret is shown)."""

from __future__ import annotations

import pytest

from gpufleet.api.models import ApiToken

pytestmark = pytest.mark.django_db


def test_it_reads_as_name_user_and_scope(viewer):
    token, _ = ApiToken.issue(viewer, "nightly", "read_write")
    assert str(token) == "nightly (vera, read and write)"


def test_it_finds_a_token_by_its_secret_only_while_live(viewer):
    token, secret = ApiToken.issue(viewer, "ci", "read")
    assert ApiToken.find(secret) == token
    assert ApiToken.find(secret + "x") is None
    token.revoke(viewer)
    assert ApiToken.find(secret) is None


def test_it_is_listed_read_only_in_the_admin(client, django_user_model, viewer):
    client.force_login(django_user_model.objects.create_superuser("root", password="x"))
    token, _ = ApiToken.issue(viewer, "ci", "read")
    assert client.get("/admin/api/apitoken/").status_code == 200
    assert "ci" in client.get(f"/admin/api/apitoken/{token.pk}/change/").content.decode()
    assert client.get("/admin/api/apitoken/add/").status_code == 403
