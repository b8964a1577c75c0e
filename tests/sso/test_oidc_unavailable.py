"""OpenID Connect login when it is off, and when its provider cannot be reached: the site
starts and serves, the password form keeps working, and the button says what is wrong."""

from __future__ import annotations

import socket

import pytest
from django.contrib.auth import authenticate
from django.test import RequestFactory

from gpufleet.sso import oidc


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def provider_down(settings, db):
    settings.GPUFLEET_OIDC_ISSUER = f"http://127.0.0.1:{_closed_port()}/realms/gpu"
    settings.GPUFLEET_OIDC_CLIENT_ID, settings.GPUFLEET_OIDC_CLIENT_SECRET = "gpufleet", "secret"
    settings.GPUFLEET_OIDC_PROVIDER_NAME = "Keycloak"
    settings.GPUFLEET_OIDC_TIMEOUT = 2.0
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, oidc.OIDC_BACKEND]
    return settings.GPUFLEET_OIDC_ISSUER


def test_off_there_is_no_button_and_no_oidc_page(client, db):
    page = client.get("/accounts/login/")
    assert page.status_code == 200 and b"Log in with" not in page.content
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


def test_with_the_provider_down_the_button_says_so_and_passwords_still_work(provider_down, client, operator):
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b"Log in with Keycloak" in page.content and b'id="id_password"' in page.content

    answer = client.get("/oidc/authenticate/")
    assert answer.status_code == 503
    assert b"Keycloak cannot be reached" in answer.content
    assert f"{provider_down}/.well-known/openid-configuration".encode() in answer.content
    assert b'href="/accounts/login/"' in answer.content

    answer = client.post("/accounts/login/", {"username": "otto", "password": "pw-otto"})
    assert answer.status_code == 302 and answer["Location"] == "/"
    assert client.get("/").status_code == 200


def test_the_backend_asks_the_provider_nothing_for_a_password_or_a_session(provider_down, operator, monkeypatch):
    import requests

    monkeypatch.setattr(requests, "get", lambda *a, **kw: pytest.fail("the provider was asked"))
    monkeypatch.setattr(requests, "post", lambda *a, **kw: pytest.fail("the provider was asked"))
    request = RequestFactory().post("/accounts/login/", {"code": "c", "state": "s"})
    request.session = {}
    backend = oidc.OIDCBackend()

    assert authenticate(request, username="otto", password="pw-otto") == operator
    assert backend.authenticate(request, username="otto", password="pw-otto") is None
    assert backend.get_user(operator.pk) == operator


def test_a_session_of_a_deactivated_user_ends(provider_down, operator):
    operator.is_active = False
    operator.save()
    assert oidc.OIDCBackend().get_user(operator.pk) is None


def test_logging_out_a_local_user_asks_the_provider_nothing(provider_down, operator_client):
    answer = operator_client.post("/accounts/logout/")
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"
