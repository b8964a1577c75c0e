"""A person taken out of the directory's groups loses access without logging in again: the
directory is asked again at most every GPUFLEET_SSO_RECHECK_S on use (LDAP: the groups read
again; OpenID Connect: the refresh token and the provider's user info), by the central beat
for people not seen, and an authenticating proxy's groups header counts at every request."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings as site
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import Action, AuditEntry
from tests.claims.helpers import lab_team
from tests.sso import ldap_server, provider
from tests.sso.test_ldap_login import log_in as ldap_log_in
from tests.sso.test_oidc_login import log_in as oidc_log_in
from tests.sso.test_oidc_login import logged_in_as
from tests.sso.test_sign_in import SETTINGS as PROXY_SETTINGS
from tests.sso.test_sign_in import through_proxy

directory, ldap_site = ldap_server.directory, ldap_server.ldap_site
openid_provider = provider.openid_provider


def later(intervals: int = 1):
    """The clock past this many recheck intervals from now."""
    return time_machine.travel(timezone.now() + intervals * timedelta(seconds=site.GPUFLEET_SSO_RECHECK_S + 5))


_claims = itertools.count()


def writes(secret: str) -> int:
    """A claim written with this token: 401 once it stops."""
    body = json.dumps({"name": f"nightly-{next(_claims)}", "count": 1})
    return Client(headers={"authorization": f"Bearer {secret}"}).post(
        "/api/nodes/alpha/claims/", body, content_type="application/json").status_code


def nightly_token(user):
    """A read-write token of `user`, who is put in team lab: writing a claim is a team
    member's (tests/claims/test_rights.py), and these tests are about the role."""
    lab_team().memberships.get_or_create(user=user)
    return ApiToken.issue(user, "nightly", ApiToken.Scope.READ_WRITE)


def roles(user) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def last_refusal(target: str) -> dict:
    return AuditEntry.objects.filter(action=Action.SSO_REFUSED, target=target).latest("id").after


@pytest.mark.integration
@pytest.mark.django_db
def test_ldap_removed_from_the_group_the_session_and_the_token_stop_at_the_recheck(ldap_site, directory, alpha):
    client, _ = ldap_log_in("alice")
    alice = User.objects.get(username="alice")
    _, secret = nightly_token(alice)
    assert writes(secret) == 201

    directory.remove_member("gpu-operators", "alice")
    # Not asked before the interval ends: the session keeps working meanwhile.
    assert client.get(reverse("fleet:overview")).status_code == 200

    with later():
        page = client.get(reverse("fleet:overview"))
        assert page.status_code == 302 and page["Location"].startswith(reverse("login"))
        assert writes(secret) == 401
    alice.refresh_from_db()
    assert not alice.is_active and roles(alice) == []
    refusal = last_refusal("alice")
    assert refusal["source"] == "ldap" and "none of the directory groups" in refusal["reason"]
    role = AuditEntry.objects.filter(action=Action.SSO_ROLE, target="alice").latest("id")
    assert (role.before, role.after["role"]) == ({"role": "operator"}, None)

    # Back in the group, her next login gives access back.
    directory.add_member("gpu-operators", "alice")
    client, _ = ldap_log_in("alice")
    assert "_auth_user_id" in client.session and writes(secret) == 201


@pytest.mark.integration
@pytest.mark.django_db
def test_ldap_a_person_still_in_the_group_keeps_access_and_is_asked_once_an_interval(ldap_site, alpha, monkeypatch):
    client, _ = ldap_log_in("alice")
    _, secret = nightly_token(User.objects.get(username="alice"))
    with later():
        assert client.get(reverse("fleet:overview")).status_code == 200
        assert writes(secret) == 201
        # Asked once this interval: the next uses do not ask again.
        from gpufleet.sso import ldap

        monkeypatch.setattr(ldap, "groups_of", lambda identity: pytest.fail("asked again"))
        assert client.get(reverse("fleet:overview")).status_code == 200 and writes(secret) == 201
    assert User.objects.get(username="alice").is_active
    assert not AuditEntry.objects.filter(action=Action.SSO_REFUSED).exists()


@pytest.mark.integration
@pytest.mark.django_db
def test_the_beat_takes_access_from_a_token_holder_who_is_not_seen(ldap_site, directory):
    from gpufleet.sso import tasks

    assert site.CELERY_BEAT_SCHEDULE["sso-recheck"]["task"] == "gpufleet.sso.tasks.recheck_directory"
    ldap_log_in("alice")
    alice = User.objects.get(username="alice")
    _, secret = nightly_token(alice)
    directory.remove_member("gpu-operators", "alice")

    tasks.recheck_directory.apply()  # not due yet
    assert User.objects.get(username="alice").is_active
    with later():
        tasks.recheck_directory.apply()
    alice.refresh_from_db()
    assert not alice.is_active and roles(alice) == []
    assert "none of the directory groups" in last_refusal("alice")["reason"]
    assert writes(secret) == 401


@pytest.mark.integration
@pytest.mark.django_db
def test_oidc_removed_from_the_group_the_session_and_the_token_stop_at_the_recheck(settings, openid_provider, alpha):
    for name, value in openid_provider.settings().items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "gpufleet.sso.oidc.OIDCBackend"]
    client = Client()
    oidc_log_in(client, openid_provider, "olivia")
    olivia = User.objects.get(username="olivia")
    _, secret = nightly_token(olivia)
    with later():  # still in the group: the refreshed user info says so
        assert client.get("/claims/").status_code == 200 and writes(secret) == 201

    openid_provider.set_groups("olivia", [])
    with later(2):
        assert client.get("/claims/").status_code == 302
        assert logged_in_as(client) is None and writes(secret) == 401
    olivia.refresh_from_db()
    assert not olivia.is_active and roles(olivia) == []
    refusal = last_refusal("olivia")
    assert refusal["source"] == "oidc" and "none of the directory groups" in refusal["reason"]


@pytest.mark.django_db
def test_a_proxys_changed_groups_header_counts_at_the_next_request(settings, alpha):
    for name, value in PROXY_SETTINGS.items():
        setattr(settings, name, value)
    client = Client()
    assert through_proxy(client, "/", "alice", "gpu-users").status_code == 200
    alice = User.objects.get(username="alice")
    _, secret = nightly_token(alice)

    assert through_proxy(client, "/", "alice", "gpu-operators").status_code == 200
    assert roles(alice) == ["operator"] and writes(secret) == 201

    response = through_proxy(client, "/", "alice", "staff", follow=True)
    assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    alice.refresh_from_db()
    assert not alice.is_active and roles(alice) == [] and writes(secret) == 401
    assert "none of the directory groups" in last_refusal("alice")["reason"]
