"""OpenID Connect login against a real provider (django-oauth-toolkit in a second process,
tests/sso/provider.py): discovery, the code flow with PKCE, state and nonce, users and roles
from the token's claims, every refusal audited, logout at both ends. The site runs in this
process (Django's test client); the person's side at the provider is a requests session
that fills in the provider's own login form."""

from __future__ import annotations

import html
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import Action, AuditEntry
from gpufleet.sso import oidc
from gpufleet.sso.models import Identity
from tests.sso import provider

pytestmark = pytest.mark.integration

openid_provider = provider.openid_provider


@pytest.fixture
def site(settings, openid_provider, db):
    """This site with OpenID Connect login at the test provider."""
    for name, value in openid_provider.settings(GPUFLEET_OIDC_PROVIDER_NAME="Test directory").items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, oidc.OIDC_BACKEND]
    return openid_provider


def start(client: Client, next_url: str = "/") -> str:
    """The button: where the site sends the person (the provider's authorization URL)."""
    answer = client.get("/oidc/authenticate/", {"next": next_url})
    assert answer.status_code == 302, answer.content
    return answer["Location"]


def come_back(client: Client, location: str):
    """The provider's redirect back to the site, followed by the person's browser."""
    parts = urlsplit(location)
    assert parts.path == "/oidc/callback/", location
    return client.get(f"{parts.path}?{parts.query}")


def log_in(client: Client, site, username: str, next_url: str = "/", person=None):
    return come_back(client, site.log_in(start(client, next_url), username, person=person))


def logged_in_as(client: Client) -> str | None:
    user_id = client.session.get("_auth_user_id")
    return get_user_model().objects.get(pk=user_id).get_username() if user_id else None


def refusals() -> list[dict]:
    return [entry.after for entry in AuditEntry.objects.filter(action=Action.SSO_REFUSED).order_by("id")]


def test_it_finds_the_providers_endpoints_in_its_discovery_document_once(site, monkeypatch):
    asked = []
    real_get = requests.get
    monkeypatch.setattr(requests, "get", lambda url, **kw: asked.append(url) or real_get(url, **kw))

    document = oidc.discovery()
    assert oidc.discovery() == document

    assert asked == [f"{site.issuer}/.well-known/openid-configuration"]
    assert document["issuer"] == site.issuer
    assert document["authorization_endpoint"] == f"{site.issuer}/authorize/"
    assert document["token_endpoint"] == f"{site.issuer}/token/"
    assert document["jwks_uri"] == f"{site.issuer}/.well-known/jwks.json"
    assert document["end_session_endpoint"] == f"{site.issuer}/logout/"


def test_a_discovery_document_for_another_issuer_is_refused(site, settings, client):
    # The document at <issuer>/.well-known must name exactly that issuer: here the
    # configured one has a trailing slash the provider's lacks.
    settings.GPUFLEET_OIDC_ISSUER = site.issuer + "/"
    with pytest.raises(oidc.ProviderUnavailable, match="names the issuer"):
        oidc.discovery()

    answer = client.get("/oidc/authenticate/")
    assert answer.status_code == 503
    assert b"names the issuer" in answer.content


def test_an_issuer_without_a_discovery_document_is_refused(site, settings):
    settings.GPUFLEET_OIDC_ISSUER = site.url + "/nothing-here"
    with pytest.raises(oidc.ProviderUnavailable, match="/nothing-here/.well-known/openid-configuration answered HTTP 404"):
        oidc.discovery()


def test_the_login_page_has_the_button_and_it_asks_for_a_code_with_pkce_state_and_nonce(site, client):
    page = client.get("/accounts/login/?next=/claims/")
    assert page.status_code == 200
    assert b"Log in with Test directory" in page.content
    assert b'href="/oidc/authenticate/?next=/claims/"' in page.content
    assert b'id="id_password"' in page.content  # the password form stays

    location = start(client, "/claims/")
    parts = urlsplit(location)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == f"{site.issuer}/authorize/"
    assert query["response_type"] == "code"
    assert query["client_id"] == provider.CLIENT_ID
    assert query["redirect_uri"] == provider.TEST_CLIENT_CALLBACK
    assert query["scope"] == "openid email profile"
    assert query["code_challenge_method"] == "S256"
    assert len(query["code_challenge"]) == 43 and len(query["state"]) >= 32 and len(query["nonce"]) >= 32


def test_an_operator_logs_in_with_the_role_their_groups_give(site, client):
    answer = log_in(client, site, "olivia", next_url="/claims/")

    assert answer.status_code == 302 and answer["Location"] == "/claims/"
    assert logged_in_as(client) == "olivia"
    assert client.get("/claims/").status_code == 200
    user = get_user_model().objects.get(username="olivia")
    assert (user.email, user.first_name, user.last_name) == ("olivia@example.org", "Olivia", "Oakes")
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]
    assert not user.has_usable_password() and not user.is_staff and not user.is_superuser
    identity = Identity.objects.get(user=user)
    assert identity.source == "oidc" and identity.subject.startswith(site.issuer + " ")
    assert identity.role == "operator" and identity.groups == ["gpu-operators"]
    login = AuditEntry.objects.get(action=Action.SSO_LOGIN)
    assert login.username == "olivia" and login.after["role"] == "operator" and login.after["source"] == "oidc"


def test_a_keycloak_group_path_maps_and_the_highest_role_wins(site, client):
    log_in(client, site, "vince")
    assert logged_in_as(client) == "vince"
    assert get_user_model().objects.get(username="vince").groups.get().name == "viewer"

    other = Client()
    log_in(other, site, "adele")
    assert get_user_model().objects.get(username="adele").groups.get().name == "admin"


def test_a_person_out_of_every_mapped_group_gets_no_access_and_loses_sessions_and_tokens(site, client):
    log_in(client, site, "olivia")
    user = get_user_model().objects.get(username="olivia")
    _, secret = ApiToken.issue(user, "ci", ApiToken.Scope.READ)
    script = Client(headers={"authorization": f"Bearer {secret}"})
    assert script.get("/api/nodes/").status_code == 200

    site.set_groups("olivia", [])
    again = Client()
    answer = log_in(again, site, "olivia")

    assert answer.status_code == 302 and answer["Location"] == "/accounts/no-access/"
    assert logged_in_as(again) is None
    page = again.get("/accounts/no-access/")
    assert b"olivia" in page.content and b"none of the directory groups" in page.content
    user.refresh_from_db()
    assert not user.is_active and not user.groups.exists()
    assert script.get("/api/nodes/").status_code == 401
    # The session from before ends too.
    assert client.get("/claims/").status_code == 302
    assert refusals()[-1]["reason"].startswith("olivia is in none of the directory groups")
    role = AuditEntry.objects.filter(action=Action.SSO_ROLE).order_by("id").last()
    assert (role.before["role"], role.after["role"]) == ("operator", None)

    # Back in the group: the next login gives the role back.
    site.set_groups("olivia", ["gpu-operators"])
    log_in(Client(), site, "olivia")
    user.refresh_from_db()
    assert user.is_active and user.groups.get().name == "operator"


@pytest.mark.parametrize(("wrong", "reason"), [
    ({"expired": 600}, "the ID token has expired"),
    ({"iss": "http://127.0.0.1:9/o"}, "the ID token was issued by 'http://127.0.0.1:9/o'"),
    ({"aud": "another-client"}, "the ID token is for another client"),
    ({"nonce": "not-the-nonce-we-sent"}, "the ID token's nonce is not the one this login sent"),
    ({"aud": [provider.CLIENT_ID, "another-client"]}, "the ID token was given to None, not 'gpufleet'"),
    ({"sub": "someone-else"}, "the provider's user info is not about the user of the ID token"),
])
def test_an_id_token_that_is_wrong_is_refused(site, client, wrong, reason):
    with site.misbehaving(**wrong):
        answer = log_in(client, site, "olivia")

    assert answer.status_code == 403
    assert reason in html.unescape(answer.content.decode())
    assert b'href="/oidc/authenticate/"' in answer.content  # try again
    assert logged_in_as(client) is None
    assert not get_user_model().objects.filter(username="olivia").exists()
    [refusal] = refusals()
    assert refusal["source"] == "oidc" and refusal["reason"].startswith(reason)


def _claims(site, **more) -> dict:
    now = int(time.time())
    return {"iss": site.issuer, "aud": provider.CLIENT_ID, "sub": "1", "iat": now, "exp": now + 300,
            "nonce": "the-nonce", **more}


def _provider_kid(site) -> str:
    [key] = requests.get(f"{site.issuer}/.well-known/jwks.json", timeout=10).json()["keys"]
    return key["kid"]


def _another_rsa_key() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def test_a_token_signed_with_the_providers_key_checks_out(site):
    token = jwt.encode(_claims(site), site.private_key_pem, algorithm="RS256", headers={"kid": _provider_kid(site)})
    assert oidc.OIDCBackend().verify_token(token, nonce="the-nonce")["sub"] == "1"


@pytest.mark.parametrize(("forge", "reason"), [
    (lambda site, kid: jwt.encode(_claims(site), _another_rsa_key(), algorithm="RS256", headers={"kid": kid}),
     "the ID token does not check out (Signature verification failed)"),
    (lambda site, kid: jwt.encode(_claims(site), provider.CLIENT_SECRET * 2, algorithm="HS256", headers={"kid": kid}),
     "the ID token is signed with 'HS256', not RS256"),
    (lambda site, kid: jwt.encode(_claims(site), None, algorithm="none", headers={"kid": kid}),
     "the ID token is signed with 'none', not RS256"),
    (lambda site, kid: jwt.encode(_claims(site), site.private_key_pem, algorithm="RS256"),
     "the ID token names no signing key"),
    (lambda site, kid: jwt.encode(_claims(site), site.private_key_pem, algorithm="RS256", headers={"kid": "other"}),
     "the ID token does not check out (Could not find a valid JWKS.)"),
    (lambda site, kid: jwt.encode({k: v for k, v in _claims(site).items() if k != "sub"}, site.private_key_pem,
                                  algorithm="RS256", headers={"kid": kid}),
     "the ID token has no sub claim"),
    (lambda site, kid: "not.a-token", "the ID token does not check out"),
])
def test_a_token_not_signed_as_the_provider_signs_is_refused(site, forge, reason):
    with pytest.raises(oidc.LoginRefused) as refusal:
        oidc.OIDCBackend().verify_token(forge(site, _provider_kid(site)), nonce="the-nonce")
    assert str(refusal.value).startswith(reason)


def test_a_token_for_several_clients_given_to_this_one_is_accepted(site, client):
    with site.misbehaving(aud=[provider.CLIENT_ID, "another-client"], azp=provider.CLIENT_ID):
        log_in(client, site, "olivia")
    assert logged_in_as(client) == "olivia"


def test_an_error_the_provider_sends_back_is_refused(site, client):
    state = parse_qs(urlsplit(start(client)).query)["state"][0]

    answer = client.get("/oidc/callback/", {"error": "access_denied", "error_description": "the user said no",
                                            "state": state})

    assert answer.status_code == 403
    assert b"the provider refused the login: the user said no" in answer.content
    assert refusals()[0]["reason"] == "the provider refused the login: the user said no"


def test_a_user_name_claim_the_provider_does_not_send_is_refused(site, settings, client):
    settings.GPUFLEET_OIDC_USERNAME_CLAIM = "nickname"
    answer = log_in(client, site, "olivia")
    assert answer.status_code == 403
    assert b"the provider sent no nickname claim to name the user by" in answer.content
    assert logged_in_as(client) is None and not get_user_model().objects.exists()


def test_it_goes_back_only_to_a_page_of_this_site(site, client):
    assert log_in(client, site, "olivia", next_url="https://evil.example/")["Location"] == "/"


def test_a_tampered_state_is_refused(site, client):
    location = site.log_in(start(client), "olivia")
    parts = urlsplit(location)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    query["state"] = "x" * len(query["state"])

    answer = client.get(f"{parts.path}?{urlencode(query)}")

    assert answer.status_code == 403
    assert b"does not match a login started in this browser" in answer.content
    assert logged_in_as(client) is None
    assert refusals()[0]["reason"].startswith("the answer's state does not match")


def test_a_callback_is_used_once(site, client):
    location = site.log_in(start(client), "olivia")
    assert come_back(client, location).status_code == 302
    client.logout()

    answer = come_back(client, location)

    assert answer.status_code == 403
    assert logged_in_as(client) is None


def test_a_wrong_password_at_the_provider_never_reaches_the_site(site, client):
    with pytest.raises(AssertionError):
        site.log_in(start(client), "olivia", password="wrong")
    assert logged_in_as(client) is None


def test_the_username_and_groups_come_from_the_claims_the_settings_name(site, settings, client):
    settings.GPUFLEET_OIDC_USERNAME_CLAIM = "email"
    log_in(client, site, "olivia")
    assert logged_in_as(client) == "olivia@example.org"

    settings.GPUFLEET_OIDC_GROUPS_CLAIM = "roles"  # a claim the provider does not send
    answer = log_in(Client(), site, "vince")
    assert answer["Location"] == "/accounts/no-access/"


def test_refused_logins_do_not_lock_the_address_out_of_the_next(site, settings, client):
    for _ in range(settings.AXES_FAILURE_LIMIT + 1):
        assert log_in(Client(), site, "ned")["Location"] == "/accounts/no-access/"

    log_in(client, site, "olivia")
    assert logged_in_as(client) == "olivia"


def test_logging_out_ends_the_site_session_and_then_the_providers(site, client):
    person = requests.Session()
    log_in(client, site, "olivia", person=person)

    answer = client.post("/accounts/logout/")

    assert logged_in_as(client) is None
    parts = urlsplit(answer["Location"])
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}
    assert f"{parts.scheme}://{parts.netloc}{parts.path}" == f"{site.issuer}/logout/"
    assert query["post_logout_redirect_uri"] == "http://testserver/accounts/login/"
    assert query["client_id"] == provider.CLIENT_ID and query["id_token_hint"].count(".") == 2
    # At the provider: its session ends and it sends the person back to the login page.
    back = person.get(answer["Location"], allow_redirects=False, timeout=10)
    assert back.status_code == 302 and back.headers["Location"] == "http://testserver/accounts/login/"
    again = person.get(start(Client()), allow_redirects=False, timeout=10)
    assert "/accounts/login/" in again.headers["Location"]


def test_a_local_user_logs_out_to_the_login_page(site, operator_client):
    answer = operator_client.post("/accounts/logout/")
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"


def test_a_forged_code_is_a_refused_login_with_its_reason(site, client):
    state = parse_qs(urlsplit(start(client)).query)["state"][0]

    answer = client.get("/oidc/callback/", {"code": "a-code-the-provider-never-issued", "state": state})

    assert answer.status_code == 403
    page = html.unescape(answer.content.decode())
    assert "the provider did not accept the login's code (invalid_grant)" in page
    assert "cannot be reached" not in page
    assert logged_in_as(client) is None
    [refusal] = refusals()
    assert refusal == {"source": "oidc", "reason": "the provider did not accept the login's code (invalid_grant)"}
