"""The API's docs page (/api/docs, Swagger UI) leads back to the site: to the fleet
and to the API tokens a script needs."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.django_db


def _links(page: str) -> dict[str, str]:
    return {text.strip(): href for href, text in re.findall(r'<a [^>]*href="([^"]+)"[^>]*>([^<]+)</a>', page)}


def test_it_links_back_to_the_site(viewer_client):
    response = viewer_client.get("/api/docs")
    assert response.status_code == 200
    links = _links(response.content.decode())
    assert links.get("← gpufleet") == "/"
    assert links.get("API tokens") == "/tokens/"
    assert viewer_client.get(links["API tokens"]).status_code == 200


def test_it_shows_the_site_icon(viewer_client):
    page = viewer_client.get("/api/docs").content.decode()
    assert '<link rel="icon" href="/static/gpufleet/favicon.svg" type="image/svg+xml">' in page
