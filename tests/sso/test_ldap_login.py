"""LDAP login through the site's own login form, against a real slapd (tests/sso/ldap_server.py):
the directory checks the password, its groups give the role at every login, and every
refusal is a refusal the person can read and the audit log keeps."""

from __future__ import annotations

import shlex
import socket
import subprocess

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from gpufleet.api.models import ApiToken
from gpufleet.audit.models import AuditEntry
from gpufleet.core.access import APPLY_FIX, EDIT_CLAIMS, VIEW, can
from gpufleet.sso.models import Identity
from tests.sso import ldap_server
from tests.sso.ldap_server import CONTACT, PEOPLE_ENTRIES, SERVICE_PASSWORD, user_dn
from tests.test_readme import readme_command

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

directory, ldap_site = ldap_server.directory, ldap_server.ldap_site


def log_in(uid: str, password: str | None = None, client: Client | None = None):
    client = client or Client(REMOTE_ADDR="127.0.0.1")
    response = client.post(reverse("login"), {"username": uid, "password": password or PEOPLE_ENTRIES[uid][2]})
    return client, response


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def roles(user) -> list[str]:
    return sorted(user.groups.values_list("name", flat=True))


def audited(target: str) -> list[tuple[str, dict | None]]:
    return list(AuditEntry.objects.filter(target=target).order_by("at", "id").values_list("action", "after"))


def api(secret: str) -> int:
    return Client(headers={"authorization": f"Bearer {secret}"}).get("/api/nodes/").status_code


def test_it_makes_a_directory_operator_an_operator(ldap_site):
    client, response = log_in("alice")

    assert response.status_code == 302 and response["Location"] == reverse("fleet:overview")
    assert logged_in(client)
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.last_name) == ("alice@example.org", "Alice", "Adams")
    assert roles(alice) == ["operator"]
    assert alice.is_active and not alice.is_staff and not alice.is_superuser
    assert not alice.has_usable_password()  # the directory keeps the password, never this site
    identity = Identity.objects.get(user=alice)
    assert (identity.source, identity.subject, identity.role) == ("ldap", user_dn("alice"), "operator")
    assert identity.groups == ["cn=gpu-operators,ou=groups,dc=example,dc=org"]
    # An operator edits claims but does not apply fixes.
    assert can(alice, VIEW) and can(alice, EDIT_CLAIMS) and not can(alice, APPLY_FIX)
    assert client.get(reverse("fleet:overview")).status_code == 200
    actions = [action for action, _ in audited("alice")]
    assert actions == ["sso.role", "sso.login"]
    assert audited("alice")[-1][1] == {"source": "ldap", "role": "operator",
                                       "groups": ["cn=gpu-operators,ou=groups,dc=example,dc=org"]}


@pytest.mark.parametrize(("uid", "role"), [("bob", "viewer"), ("dave", "admin"), ("nina", "admin")])
def test_each_mapped_group_gives_its_role_and_never_superuser(ldap_site, uid, role):
    # nina is an admin only through gpu-leads, a group inside gpu-admins.
    client, _ = log_in(uid)

    assert logged_in(client)
    user = User.objects.get(username=uid)
    assert roles(user) == [role]
    assert not user.is_superuser and not user.is_staff


def test_active_directorys_group_type_follows_nested_groups(ldap_site):
    # Active Directory's group search, on slapd's groupOfNames (AD's groups are objectClass=group).
    ldap_site(GPUFLEET_LDAP_GROUP_TYPE="activeDirectory", GPUFLEET_LDAP_GROUP_FILTER="(objectClass=groupOfNames)")
    client, _ = log_in("nina")
    assert logged_in(client)
    assert roles(User.objects.get(username="nina")) == ["admin"]


def test_a_person_in_no_mapped_group_gets_no_access_and_is_told_whom_to_ask(ldap_site):
    client, response = log_in("carol")

    assert not logged_in(client)
    assert response.status_code == 302 and response["Location"] == reverse("sso:no-access")
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert CONTACT in page.content.decode() and "carol" in page.content.decode()
    assert not User.objects.filter(username="carol", is_active=True).exists()
    [(action, after)] = audited("carol")
    assert action == "sso.refused" and after["source"] == "ldap"


def test_a_default_role_lets_a_person_in_no_group_in(ldap_site, settings):
    settings.GPUFLEET_SSO_DEFAULT_ROLE = "viewer"
    client, _ = log_in("carol")
    assert logged_in(client)
    assert roles(User.objects.get(username="carol")) == ["viewer"]


def test_removed_from_the_group_the_next_login_has_no_access_and_the_token_stops(ldap_site, directory):
    earlier, _ = log_in("alice")
    alice = User.objects.get(username="alice")
    _, secret = ApiToken.issue(alice, "nightly report", ApiToken.Scope.READ)
    assert api(secret) == 200
    assert earlier.get(reverse("fleet:overview")).status_code == 200

    directory.remove_member("gpu-operators", "alice")
    client, response = log_in("alice")

    assert not logged_in(client)
    assert response["Location"] == reverse("sso:no-access")
    alice.refresh_from_db()
    assert not alice.is_active and roles(alice) == []
    assert api(secret) == 401
    # The session she already had ends at its next request.
    assert earlier.get(reverse("fleet:overview"))["Location"].startswith(reverse("login"))
    assert [action for action, _ in audited("alice")][-2:] == ["sso.role", "sso.refused"]
    role_change = AuditEntry.objects.filter(target="alice", action="sso.role").latest("id")
    assert (role_change.before, role_change.after["role"]) == ({"role": "operator"}, None)

    # Put back in the group, she has access again, her token with it.
    directory.add_member("gpu-operators", "alice")
    client, _ = log_in("alice", client=client)
    assert logged_in(client)
    alice.refresh_from_db()
    assert alice.is_active and roles(alice) == ["operator"]
    assert api(secret) == 200


def test_wrong_passwords_are_refused_audited_and_throttled(ldap_site, settings):
    settings.AXES_FAILURE_LIMIT = 3
    client = Client(REMOTE_ADDR="127.0.0.1")
    codes = [log_in("bob", "not-bobs", client)[1].status_code for _ in range(3)]

    assert codes == [200, 200, 429]
    assert not User.objects.filter(username="bob").exists()
    actions = [action for action, _ in audited("bob")]
    assert actions[:2] == ["sso.refused", "sso.refused"] and "login.lockout" in actions
    assert audited("bob")[0][1] == {"source": "ldap", "reason": "the directory refused the password"}
    # Locked out: the right password does not help until the lockout ends.
    assert log_in("bob", client=client)[1].status_code == 429


def test_a_name_the_directory_does_not_know_writes_no_sso_row(ldap_site):
    client, response = log_in("zed", "anything")
    assert response.status_code == 200 and not logged_in(client)
    assert not AuditEntry.objects.filter(action__startswith="sso.").exists()


def test_a_local_account_of_the_same_name_is_not_taken_over(ldap_site, django_user_model):
    local = django_user_model.objects.create_user("mallory", password="local-password-of-mallory")

    client, response = log_in("mallory")

    assert not logged_in(client) and response["Location"] == reverse("sso:no-access")
    local.refresh_from_db()
    assert local.is_active and local.check_password("local-password-of-mallory") and roles(local) == []
    assert not Identity.objects.exists()
    [(action, after)] = audited("mallory")
    assert action == "sso.refused" and "local account" in after["reason"]
    # Its own password still logs the local account in.
    client, _ = log_in("mallory", "local-password-of-mallory", Client(REMOTE_ADDR="127.0.0.1"))
    assert logged_in(client) and int(client.session["_auth_user_id"]) == local.pk


def test_the_login_name_is_the_same_user_in_any_case(ldap_site):
    log_in("alice")
    client, _ = log_in("ALICE", PEOPLE_ENTRIES["alice"][2])
    assert logged_in(client)
    assert list(User.objects.values_list("username", flat=True)) == ["alice"]


@pytest.mark.parametrize("name", ["*", "al*", "alice)(uid=*", "*)(|(uid=*"])
def test_a_login_name_is_never_read_as_a_filter(ldap_site, name):
    client, response = log_in(name, PEOPLE_ENTRIES["alice"][2])
    assert response.status_code == 200 and not logged_in(client)
    assert not User.objects.exists()


def test_an_empty_password_never_binds(ldap_site, rf):
    # An LDAP bind with a DN and no password is an anonymous bind that "succeeds".
    from django.contrib.auth import authenticate

    request = rf.post(reverse("login"))
    assert authenticate(request, username="alice", password="") is None
    assert not User.objects.exists()


def test_a_user_an_admin_deactivated_stays_so(ldap_site):
    log_in("alice")
    User.objects.filter(username="alice").update(is_active=False)

    client, response = log_in("alice")

    assert not logged_in(client) and response["Location"] == reverse("sso:no-access")
    assert not User.objects.get(username="alice").is_active
    assert "deactivated by an admin" in audited("alice")[-1][1]["reason"]


def test_starttls_with_the_ca_file_logs_in(ldap_site, directory):
    ldap_site(GPUFLEET_LDAP_START_TLS="true", GPUFLEET_LDAP_CA_FILE=str(directory.ca_file))
    client, _ = log_in("alice")
    assert logged_in(client)


def test_ldaps_with_the_ca_file_logs_in(ldap_site, directory):
    ldap_site(GPUFLEET_LDAP_URI=directory.ldaps_uri, GPUFLEET_LDAP_CA_FILE=str(directory.ca_file))
    client, _ = log_in("alice")
    assert logged_in(client)


@pytest.mark.parametrize("tls", ["starttls", "ldaps"])
def test_a_directory_whose_certificate_is_not_trusted_is_a_clear_refusal(ldap_site, directory, tls):
    if tls == "starttls":
        ldap_site(GPUFLEET_LDAP_START_TLS="true")
    else:
        ldap_site(GPUFLEET_LDAP_URI=directory.ldaps_uri)

    client, response = log_in("alice")

    assert not logged_in(client) and response.status_code == 200
    page = response.content.decode()
    assert "The directory could not check your password" in page and CONTACT in page
    assert not User.objects.filter(username="alice").exists()
    [(action, after)] = audited("alice")
    assert action == "sso.refused"
    assert after["source"] == "ldap" and after["reason"].startswith("the directory could not be reached")
    assert "GPUFLEET_LDAP_CA_FILE" in after["reason"]


def test_the_documented_group_search_finds_the_persons_groups(directory, tmp_path):
    # docs/sso.md's check by hand, run against this slapd: its DNs are the docs' example's.
    password = tmp_path / "ldap-bind-password"
    password.write_text(SERVICE_PASSWORD)
    command = (readme_command("LDAPTLS_CACERT=")
               .replace("/etc/gpufleet/ldap-ca.pem", str(directory.ca_file))
               .replace("ldap://ldap.example.org", directory.uri)
               .replace("/etc/gpufleet/ldap-bind-password", str(password)))
    environment, *argv = shlex.split(command)
    name, _, value = environment.partition("=")
    done = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", name: value}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "dn: cn=gpu-operators,ou=groups,dc=example,dc=org" in done.stdout


def test_with_the_directory_down_its_people_are_told_and_local_accounts_still_log_in(ldap_site, viewer):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    ldap_site(GPUFLEET_LDAP_URI=f"ldap://127.0.0.1:{closed}", GPUFLEET_LDAP_TIMEOUT="1")

    client, response = log_in("alice")
    assert not logged_in(client) and "The directory could not check your password" in response.content.decode()
    assert "Can't contact LDAP server" in audited("alice")[-1][1]["reason"]

    client, _ = log_in("vera", "pw-vera")
    assert logged_in(client)


def test_a_local_login_of_a_name_the_directory_shares_writes_no_directory_refusal(ldap_site, django_user_model):
    # mallory is a local account here and a different person in the directory: a mistyped
    # local password is no password the directory refused, as the directory's mallory never
    # logs in here.
    local = django_user_model.objects.create_user("mallory", password="local-password-of-mallory")

    client, response = log_in("mallory", "local-password-of-mallroy")
    assert response.status_code == 200 and not logged_in(client)
    client, response = log_in("mallory", "local-password-of-mallory", client)

    assert logged_in(client) and int(client.session["_auth_user_id"]) == local.pk
    assert not AuditEntry.objects.filter(action="sso.refused").exists(), audited("mallory")


def test_a_directory_admin_opens_the_admin_site_without_staff_status(ldap_site):
    # As docs/deployment.md and docs/configuration.md say: the admin role, not "Staff status".
    client, _ = log_in("dave")

    assert not User.objects.get(username="dave").is_staff
    assert client.get("/admin/").status_code == 200
    assert 'href="/admin/"' in client.get("/").content.decode()
