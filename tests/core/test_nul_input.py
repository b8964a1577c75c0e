"""A NUL character in a query parameter or a form field (name or value) is a 400 before
any view runs: PostgreSQL refuses NUL in text, so each view or admin filter that queried
with one answered 500, and no field of the site may hold one."""

from __future__ import annotations

import pytest

from gpufleet.claims.models import Claim
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "url",
    [
        "/admin/fleet/node/?name=a%00b",
        "/admin/fleet/node/?name__exact=a%00b",
        "/admin/auth/user/?username=a%00b",
        "/claims/?q=a%00b",
        "/audit/?q=a%00b",
        "/?driver=a%00b",
        "/claims/find/?model=a%00b",
        "/?a%00b=1",
    ],
)
def test_a_nul_in_the_query_is_a_bad_request(admin_role_client, url):
    make_node("alpha", 2)
    response = admin_role_client.get(url)
    assert response.status_code == 400


def test_a_nul_in_a_form_field_is_a_bad_request(operator_client):
    node = make_node("alpha", 2)
    gone = claim(node, "train", count=1)
    gone.delete()
    # The editor of a claim deleted meanwhile looks up the node the form names.
    response = operator_client.post(f"/claims/{gone.pk}/edit/", {"node": "a\x00b", "name": "x"})
    assert response.status_code == 400
    assert not Claim.objects.exists()


def test_the_api_answers_a_nul_in_its_own_error_shape(viewer_client):
    response = viewer_client.get("/api/claims/?owner=a%00b")
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "bad_request",
        "message": "a query parameter or form field holds a NUL character",
    }


@pytest.mark.parametrize("url", ["/claims/?q=a%09b", "/claims/?q=%C3%BC%E2%82%AC", "/claims/?q=a%01b"])
def test_other_characters_still_reach_the_page(viewer_client, url):
    assert viewer_client.get(url).status_code == 200
