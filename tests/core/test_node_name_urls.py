"""A node name in a URL that no node can have (a NUL or another control character:
PostgreSQL refuses a NUL in text outright) is a 404 from the URL resolver, for every
URL that takes a node name, before any view queries with it."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
from django.urls import NoReverseMatch, Resolver404, resolve, reverse

from tests.factories import ingest

pytestmark = pytest.mark.django_db

# Every page and API URL that takes a node name, as the method that reaches its view.
NODE_URLS = [
    ("get", "/nodes/{}/"),
    ("get", "/nodes/{}/findings/"),
    ("get", "/nodes/{}/report.json"),
    ("post", "/nodes/{}/gpus/0/acknowledge-xid/"),
    ("post", "/nodes/{}/diagnose/"),
    ("get", "/nodes/{}/fix/cdi/"),
    ("get", "/claims/nodes/{}/panel/"),
    ("get", "/claims/nodes/{}/new/"),
    ("post", "/claims/nodes/{}/validate/"),
    ("get", "/api/nodes/{}/"),
    ("get", "/api/nodes/{}/devices/"),
    ("get", "/api/nodes/{}/findings/"),
    ("get", "/api/nodes/{}/claims/"),
    ("post", "/api/nodes/{}/claims/"),
]


BAD_NAMES = ["a%00b", "%00", "a%01b", "a%7Fb", "a%0Ab"]


@pytest.mark.parametrize(("method", "url"), NODE_URLS)
@pytest.mark.parametrize("bad", BAD_NAMES)
def test_the_resolver_matches_no_view_for_a_control_character_in_a_node_name(method, url, bad):
    path = unquote(url.format(bad))
    try:
        match = resolve(path)
    except Resolver404:
        return
    # The API's catch-all answers any other path under /api/ with its own JSON 404.
    assert match.url_name is None and path.startswith("/api/"), match


@pytest.mark.parametrize(("method", "url"), NODE_URLS)
@pytest.mark.parametrize("bad", BAD_NAMES)
def test_a_control_character_in_a_node_name_is_not_found(admin_role_client, method, url, bad):
    ingest("alpha", 1)
    response = _send(admin_role_client, method, url.format(bad))
    assert response.status_code == 404


@pytest.mark.parametrize(("method", "url"), NODE_URLS)
def test_a_real_node_name_still_reaches_the_view(admin_role_client, sent_tasks, method, url):
    ingest("alpha.gpu-01_b", 1, fixes=["cdi"])
    response = _send(admin_role_client, method, url.format("alpha.gpu-01_b"))
    assert response.status_code < 400 or response.status_code == 422, response.status_code


def test_reverse_refuses_a_name_with_a_control_character():
    assert reverse("fleet:node_detail", kwargs={"name": "alpha"}) == "/nodes/alpha/"
    with pytest.raises(NoReverseMatch):
        reverse("fleet:node_detail", kwargs={"name": "a\x00b"})


def _send(client, method: str, url: str):
    if method == "post" and url.startswith("/api/"):
        return client.post(url, {"name": "train", "count": 1}, content_type="application/json")
    return getattr(client, method)(url)
