"""GPUFLEET_OIDC_*: read with their defaults, and every bad value refused at start-up with a
message naming the variable (gpufleet/sso/oidc_settings.py)."""

from __future__ import annotations

import pytest

from gpufleet.env import SettingError
from gpufleet.sso import oidc_settings
from tests.sso import environment

GOOD = {
    "GPUFLEET_OIDC_ISSUER": "https://sso.example.org/realms/gpu",
    "GPUFLEET_OIDC_CLIENT_ID": "gpufleet",
    "GPUFLEET_OIDC_CLIENT_SECRET": "client-secret",
}


@pytest.fixture
def environ(monkeypatch):
    return environment.only(monkeypatch, "GPUFLEET_OIDC_", GOOD)


def refused(message: str) -> None:
    with pytest.raises(SettingError, match=message):
        oidc_settings.read()


def test_it_is_off_without_an_issuer_and_asks_for_nothing_else(environ):
    environ(GPUFLEET_OIDC_ISSUER=None, GPUFLEET_OIDC_CLIENT_ID=None, GPUFLEET_OIDC_CLIENT_SECRET=None)
    got = oidc_settings.read()
    assert got["GPUFLEET_OIDC_ISSUER"] == ""
    assert got["GPUFLEET_OIDC_PROVIDER_NAME"] == "single sign-on"


def test_it_reads_the_defaults(environ):
    environ()
    assert oidc_settings.read() == {
        "GPUFLEET_OIDC_ISSUER": "https://sso.example.org/realms/gpu",
        "GPUFLEET_OIDC_CLIENT_ID": "gpufleet",
        "GPUFLEET_OIDC_CLIENT_SECRET": "client-secret",
        "GPUFLEET_OIDC_SCOPES": "openid email profile",
        "GPUFLEET_OIDC_PROVIDER_NAME": "single sign-on",
        "GPUFLEET_OIDC_USERNAME_CLAIM": "preferred_username",
        "GPUFLEET_OIDC_GROUPS_CLAIM": "groups",
        "GPUFLEET_OIDC_SIGN_ALGO": "RS256",
        "GPUFLEET_OIDC_CA_FILE": "",
        "GPUFLEET_OIDC_TIMEOUT": 10.0,
    }


def test_it_reads_the_secret_from_a_file(environ, tmp_path):
    secret = tmp_path / "oidc-secret"
    secret.write_text("from-the-file\n")
    environ(GPUFLEET_OIDC_CLIENT_SECRET=None, GPUFLEET_OIDC_CLIENT_SECRET_FILE=str(secret))
    assert oidc_settings.read()["GPUFLEET_OIDC_CLIENT_SECRET"] == "from-the-file"


def test_a_plain_http_issuer_is_fine_on_loopback_in_production(environ):
    environ(GPUFLEET_OIDC_ISSUER="http://127.0.0.1:8080/realms/gpu", GPUFLEET_PRODUCTION="true")
    assert oidc_settings.read()["GPUFLEET_OIDC_ISSUER"] == "http://127.0.0.1:8080/realms/gpu"


def test_it_takes_a_ca_file_that_exists(environ, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    environ(GPUFLEET_OIDC_CA_FILE=str(bundle), GPUFLEET_OIDC_SIGN_ALGO="es256",
            GPUFLEET_OIDC_SCOPES="openid  profile groups", GPUFLEET_OIDC_PROVIDER_NAME="Keycloak")
    got = oidc_settings.read()
    assert got["GPUFLEET_OIDC_CA_FILE"] == str(bundle)
    assert got["GPUFLEET_OIDC_SIGN_ALGO"] == "ES256"
    assert got["GPUFLEET_OIDC_SCOPES"] == "openid profile groups"
    assert got["GPUFLEET_OIDC_PROVIDER_NAME"] == "Keycloak"


@pytest.mark.parametrize(("values", "message"), [
    ({"GPUFLEET_OIDC_CLIENT_ID": None}, "GPUFLEET_OIDC_CLIENT_ID"),
    ({"GPUFLEET_OIDC_CLIENT_SECRET": None}, "GPUFLEET_OIDC_CLIENT_SECRET"),
    ({"GPUFLEET_OIDC_CLIENT_SECRET": None, "GPUFLEET_OIDC_CLIENT_SECRET_FILE": "/nonexistent/secret"},
     "GPUFLEET_OIDC_CLIENT_SECRET_FILE"),
    ({"GPUFLEET_OIDC_CLIENT_SECRET_FILE": "/etc/hostname"}, "both"),
    ({"GPUFLEET_OIDC_ISSUER": "sso.example.org"}, "GPUFLEET_OIDC_ISSUER"),
    ({"GPUFLEET_OIDC_ISSUER": "https://sso.example.org/realms/gpu?x=1"}, "GPUFLEET_OIDC_ISSUER"),
    ({"GPUFLEET_OIDC_ISSUER": "http://sso.example.org/realms/gpu", "GPUFLEET_PRODUCTION": "true"}, "https"),
    ({"GPUFLEET_OIDC_SCOPES": "email profile"}, "openid"),
    ({"GPUFLEET_OIDC_SIGN_ALGO": "HS256"}, "GPUFLEET_OIDC_SIGN_ALGO"),
    ({"GPUFLEET_OIDC_SIGN_ALGO": "none"}, "GPUFLEET_OIDC_SIGN_ALGO"),
    ({"GPUFLEET_OIDC_CA_FILE": "/nonexistent/ca.pem"}, "GPUFLEET_OIDC_CA_FILE"),
    ({"GPUFLEET_OIDC_TIMEOUT": "0.1"}, "GPUFLEET_OIDC_TIMEOUT"),
])
def test_it_refuses_a_bad_value_naming_the_variable(environ, values, message):
    environ(**values)
    refused(message)


def test_blank_claim_names_are_the_defaults(environ):
    environ(GPUFLEET_OIDC_USERNAME_CLAIM=" ", GPUFLEET_OIDC_GROUPS_CLAIM="")
    got = oidc_settings.read()
    assert (got["GPUFLEET_OIDC_USERNAME_CLAIM"], got["GPUFLEET_OIDC_GROUPS_CLAIM"]) == ("preferred_username", "groups")


def test_the_logout_form_may_be_sent_on_to_the_provider():
    policy = {"DIRECTIVES": {"default-src": ["'self'"], "form-action": ["'self'"]}}
    got = oidc_settings.allow_logout_at_provider(policy, "https://sso.example.org:8443/realms/gpu")
    assert got["DIRECTIVES"]["form-action"] == ["'self'", "https://sso.example.org:8443"]
    assert policy["DIRECTIVES"]["form-action"] == ["'self'"]  # the site's own is left as it was
