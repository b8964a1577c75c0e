"""The site's icon: every page links it, and /favicon.ico (which browsers and tools
ask for on their own, logged in or not) answers with an icon instead of a 404."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

SVG_LINK = '<link rel="icon" href="/static/gpufleet/favicon.svg" type="image/svg+xml">'


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


def test_every_page_links_the_icon(client, viewer_client):
    assert SVG_LINK in client.get("/accounts/login/").content.decode()
    assert SVG_LINK in viewer_client.get("/").content.decode()
    icon = client.get("/static/gpufleet/favicon.svg")
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in _body(icon)


def test_favicon_ico_answers_anyone_with_an_icon(client):
    response = client.get("/favicon.ico", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain and response.redirect_chain[-1][0] == "/static/gpufleet/favicon.ico"
    assert response["Content-Type"] in ("image/x-icon", "image/vnd.microsoft.icon")
    assert _body(response)[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
