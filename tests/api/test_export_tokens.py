"""Every export a script downloads (doctor reports of a node and of the fleet, claims
against use) takes an API token (`Authorization: Bearer`) as the API does, under the
same role rules as a logged-in user: a bad or revoked token is 401, never the login
page, and a browser without a session is still sent to log in."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from gpufleet.api.models import ApiToken

pytestmark = pytest.mark.django_db

EXPORTS = [
    "/nodes/alpha/report.json", "/nodes/alpha/report.csv", "/nodes/alpha/report.md",
    "/report.json", "/report.csv", "/report.md",
    "/claims/use.json", "/claims/use.csv",
    "/events/export.json", "/events/export.csv",
    "/usage/export.json", "/usage/export.csv",
]


def _bearer(secret: str) -> Client:
    return Client(headers={"authorization": f"Bearer {secret}"})


def _body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.mark.parametrize("url", EXPORTS)
def test_it_exports_to_a_token(viewer, alpha, url):
    token, secret = ApiToken.issue(viewer, "nightly export", "read")
    response = _bearer(secret).get(url)
    assert response.status_code == 200, response.content
    assert response["Content-Disposition"].startswith("attachment;")
    assert _body(response)
    assert "sessionid" not in response.cookies  # a token logs no one in
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.parametrize("url", EXPORTS)
def test_it_refuses_a_revoked_token_with_401(viewer, alpha, url):
    token, secret = ApiToken.issue(viewer, "old", "read")
    token.revoke(viewer)
    response = _bearer(secret).get(url)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert "Content-Disposition" not in response


@pytest.mark.parametrize("url", EXPORTS)
def test_it_sends_a_browser_without_a_session_to_log_in(alpha, url):
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


@pytest.mark.parametrize("url", ["/report.json", "/claims/use.csv", "/nodes/alpha/report.md"])
def test_a_token_gets_no_more_than_its_users_role(outsider, alpha, url):
    _, secret = ApiToken.issue(outsider, "no role", "read_write")
    assert _bearer(secret).get(url).status_code == 403


def test_an_unknown_token_is_401_even_beside_a_session(viewer_client, alpha):
    # The caller meant the token: never fall back to the session, as the API does not.
    response = viewer_client.get("/report.json", headers={"authorization": "Bearer gpf_not-a-token"})
    assert response.status_code == 401


def test_a_deactivated_users_token_is_401(viewer, alpha):
    _, secret = ApiToken.issue(viewer, "script", "read")
    viewer.is_active = False
    viewer.save()
    assert _bearer(secret).get("/report.csv").status_code == 401


def test_a_token_still_only_reads_an_export(viewer, alpha):
    _, secret = ApiToken.issue(viewer, "script", "read_write")
    assert _bearer(secret).post("/report.json").status_code == 405


def _routes(resolver: URLResolver, prefix: str = "", namespace: str = ""):
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            inner = f"{namespace}{entry.namespace}:" if entry.namespace else namespace
            yield from _routes(entry, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), f"{namespace}{entry.name}"


def test_every_download_url_is_in_this_list():
    """A new export (a page's URL ending in a file suffix; the API and its schema answer
    tokens themselves) must join EXPORTS above, so it is tried with a token."""
    # /favicon.ico is the site's icon, open to anyone, no export; a calendar feed's secret
    # URL is its own credential (tests/api/test_calendar_feeds.py).
    downloads = {name for route, name in _routes(get_resolver())
                 if re.search(r"\\\.\(|\.\w+$", route) and not route.startswith("api/")
                 and name not in ("favicon", "calendar_feed")}
    assert downloads == {"fleet:report", "fleet:node_report", "claims:use_export", "events:export",
                         "usage:export"}
