"""GPUFLEET_LDAP_*: read into django-auth-ldap's settings, and every bad value refused at
start-up with a message naming the variable (gpufleet/sso/ldap_settings.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ldap
import pytest
from django_auth_ldap.config import (
    GroupOfNamesType,
    GroupOfUniqueNamesType,
    NestedActiveDirectoryGroupType,
    NestedGroupOfNamesType,
    PosixGroupType,
)

from gpufleet.env import SettingError
from gpufleet.sso import ldap_settings
from tests.sso import environment

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "GPUFLEET_LDAP_URI": "ldap://ldap.example.org",
    "GPUFLEET_LDAP_BIND_DN": "cn=gpufleet,ou=services,dc=example,dc=org",
    "GPUFLEET_LDAP_BIND_PASSWORD": "service-secret",
    "GPUFLEET_LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=org",
    "GPUFLEET_LDAP_GROUP_SEARCH_BASE": "ou=groups,dc=example,dc=org",
    "GPUFLEET_LDAP_START_TLS": "true",
}


@pytest.fixture
def environ(monkeypatch):
    return environment.only(monkeypatch, "GPUFLEET_LDAP_", GOOD)


def refused(message: str) -> None:
    with pytest.raises(SettingError, match=message):
        ldap_settings.read()


def test_it_reads_nothing_without_a_uri(environ):
    environ(GPUFLEET_LDAP_URI=None)
    assert ldap_settings.read() == {"GPUFLEET_LDAP_URI": ""}


def test_it_builds_django_auth_ldaps_settings(environ):
    environ()
    got = ldap_settings.read()

    assert got["GPUFLEET_LDAP_URI"] == got["AUTH_LDAP_SERVER_URI"] == "ldap://ldap.example.org"
    assert got["AUTH_LDAP_BIND_DN"] == "cn=gpufleet,ou=services,dc=example,dc=org"
    assert got["AUTH_LDAP_BIND_PASSWORD"] == "service-secret"
    assert got["AUTH_LDAP_START_TLS"] is True
    user_search, group_search = got["AUTH_LDAP_USER_SEARCH"], got["AUTH_LDAP_GROUP_SEARCH"]
    assert (user_search.base_dn, user_search.scope, user_search.filterstr) == (
        "ou=people,dc=example,dc=org", ldap.SCOPE_SUBTREE, "(uid=%(user)s)")
    assert (group_search.base_dn, group_search.filterstr) == ("ou=groups,dc=example,dc=org",
                                                              "(objectClass=groupOfNames)")
    assert type(got["AUTH_LDAP_GROUP_TYPE"]) is GroupOfNamesType
    assert got["GPUFLEET_LDAP_ATTRS"] == {"email": "mail", "first_name": "givenName", "last_name": "sn"}
    # Groups are asked for at every login, never cached; no permission comes from LDAP itself.
    assert got["AUTH_LDAP_CACHE_TIMEOUT"] == 0
    assert got["AUTH_LDAP_FIND_GROUP_PERMS"] is False
    options = got["AUTH_LDAP_CONNECTION_OPTIONS"]
    assert options[ldap.OPT_X_TLS_REQUIRE_CERT] == ldap.OPT_X_TLS_DEMAND
    assert options[ldap.OPT_REFERRALS] == 0
    assert options[ldap.OPT_NETWORK_TIMEOUT] == options[ldap.OPT_TIMEOUT] == 10.0
    # The new TLS context is made last, from the options before it.
    assert list(options)[-1] == ldap.OPT_X_TLS_NEWCTX


@pytest.mark.parametrize(("name", "kind", "default_filter"), [
    ("groupOfNames", GroupOfNamesType, "(objectClass=groupOfNames)"),
    ("nestedGroupOfNames", NestedGroupOfNamesType, "(objectClass=groupOfNames)"),
    ("groupofuniquenames", GroupOfUniqueNamesType, "(objectClass=groupOfUniqueNames)"),
    ("posixGroup", PosixGroupType, "(objectClass=posixGroup)"),
    ("activeDirectory", NestedActiveDirectoryGroupType, "(objectClass=group)"),
])
def test_it_knows_the_group_types(environ, name, kind, default_filter):
    environ(GPUFLEET_LDAP_GROUP_TYPE=name)
    got = ldap_settings.read()
    assert type(got["AUTH_LDAP_GROUP_TYPE"]) is kind
    assert got["AUTH_LDAP_GROUP_SEARCH"].filterstr == default_filter


def test_posix_groups_need_the_users_uid_and_gid(environ):
    environ(GPUFLEET_LDAP_GROUP_TYPE="posixGroup")
    assert {"uid", "gidNumber"} <= set(ldap_settings.read()["AUTH_LDAP_USER_ATTRLIST"])


def test_it_takes_a_group_filter_attributes_and_timeout(environ):
    environ(GPUFLEET_LDAP_GROUP_FILTER="(objectClass=groupOfNames)", GPUFLEET_LDAP_GROUP_TYPE="activeDirectory",
            GPUFLEET_LDAP_ATTR_EMAIL="userPrincipalName", GPUFLEET_LDAP_ATTR_FIRST_NAME="",
            GPUFLEET_LDAP_TIMEOUT="3", GPUFLEET_LDAP_USER_FILTER="(&(objectClass=user)(sAMAccountName=%(user)s))")
    got = ldap_settings.read()
    assert got["AUTH_LDAP_GROUP_SEARCH"].filterstr == "(objectClass=groupOfNames)"
    assert got["AUTH_LDAP_USER_SEARCH"].filterstr == "(&(objectClass=user)(sAMAccountName=%(user)s))"
    assert got["GPUFLEET_LDAP_ATTRS"] == {"email": "userPrincipalName", "last_name": "sn"}
    assert got["AUTH_LDAP_USER_ATTRLIST"] == ["userPrincipalName", "sn"]
    assert got["AUTH_LDAP_CONNECTION_OPTIONS"][ldap.OPT_NETWORK_TIMEOUT] == 3.0


def test_it_reads_the_bind_password_from_a_file(environ, tmp_path):
    secret = tmp_path / "bind-password"
    secret.write_text("from-a-file\n")
    environ(GPUFLEET_LDAP_BIND_PASSWORD=None, GPUFLEET_LDAP_BIND_PASSWORD_FILE=str(secret))
    assert ldap_settings.read()["AUTH_LDAP_BIND_PASSWORD"] == "from-a-file"


def test_it_trusts_the_ca_file_it_is_given(environ, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    environ(GPUFLEET_LDAP_URI="ldaps://ldap.example.org", GPUFLEET_LDAP_START_TLS=None, GPUFLEET_LDAP_CA_FILE=str(ca))
    got = ldap_settings.read()
    assert got["AUTH_LDAP_START_TLS"] is False
    assert got["AUTH_LDAP_CONNECTION_OPTIONS"][ldap.OPT_X_TLS_CACERTFILE] == str(ca)


def test_active_directory_may_bind_by_user_principal_name(environ):
    environ(GPUFLEET_LDAP_BIND_DN="svc-gpufleet@corp.example.com")
    assert ldap_settings.read()["AUTH_LDAP_BIND_DN"] == "svc-gpufleet@corp.example.com"


def test_anonymous_search_needs_no_bind_dn(environ):
    environ(GPUFLEET_LDAP_BIND_DN=None, GPUFLEET_LDAP_BIND_PASSWORD=None)
    got = ldap_settings.read()
    assert (got["AUTH_LDAP_BIND_DN"], got["AUTH_LDAP_BIND_PASSWORD"]) == ("", "")


@pytest.mark.parametrize(("values", "message"), [
    ({"GPUFLEET_LDAP_URI": "http://ldap.example.org"}, r"GPUFLEET_LDAP_URI: 'http://ldap.example.org' is not"),
    ({"GPUFLEET_LDAP_URI": "ldap://a ldaps://b"}, r"GPUFLEET_LDAP_START_TLS.*ldaps://"),
    ({"GPUFLEET_LDAP_USER_SEARCH_BASE": None}, r"GPUFLEET_LDAP_USER_SEARCH_BASE must be set"),
    ({"GPUFLEET_LDAP_USER_SEARCH_BASE": "people"}, r"GPUFLEET_LDAP_USER_SEARCH_BASE: 'people' is not a DN"),
    ({"GPUFLEET_LDAP_GROUP_SEARCH_BASE": None}, r"GPUFLEET_LDAP_GROUP_SEARCH_BASE must be set"),
    ({"GPUFLEET_LDAP_BIND_DN": "gpufleet"}, r"GPUFLEET_LDAP_BIND_DN: 'gpufleet' is not a DN"),
    ({"GPUFLEET_LDAP_BIND_PASSWORD": None}, r"GPUFLEET_LDAP_BIND_DN needs a password"),
    ({"GPUFLEET_LDAP_BIND_DN": None}, r"GPUFLEET_LDAP_BIND_PASSWORD.*without GPUFLEET_LDAP_BIND_DN"),
    ({"GPUFLEET_LDAP_BIND_PASSWORD_FILE": "/nonexistent/pw"}, r"not both"),
    ({"GPUFLEET_LDAP_BIND_PASSWORD": None, "GPUFLEET_LDAP_BIND_PASSWORD_FILE": "/nonexistent/pw"},
     r"GPUFLEET_LDAP_BIND_PASSWORD_FILE: cannot read '/nonexistent/pw'"),
    ({"GPUFLEET_LDAP_USER_FILTER": "(uid=alice)"}, r"GPUFLEET_LDAP_USER_FILTER.*%\(user\)s"),
    ({"GPUFLEET_LDAP_USER_FILTER": "uid=%(user)s"}, r"GPUFLEET_LDAP_USER_FILTER.*parentheses"),
    ({"GPUFLEET_LDAP_USER_FILTER": "(&(uid=%(user)s)"}, r"GPUFLEET_LDAP_USER_FILTER.*parentheses"),
    ({"GPUFLEET_LDAP_USER_FILTER": "(uid=%(user)s%d)"}, r"GPUFLEET_LDAP_USER_FILTER.*%%"),
    ({"GPUFLEET_LDAP_GROUP_FILTER": "objectClass=group"}, r"GPUFLEET_LDAP_GROUP_FILTER.*parentheses"),
    ({"GPUFLEET_LDAP_GROUP_TYPE": "ad"}, r"GPUFLEET_LDAP_GROUP_TYPE: 'ad' is not one of groupOfNames"),
    ({"GPUFLEET_LDAP_START_TLS": "maybe"}, r"GPUFLEET_LDAP_START_TLS='maybe' is not a boolean"),
    ({"GPUFLEET_LDAP_CA_FILE": "/nonexistent/ca.pem"}, r"GPUFLEET_LDAP_CA_FILE: cannot read '/nonexistent/ca.pem'"),
    ({"GPUFLEET_LDAP_ATTR_EMAIL": "mail address"}, r"GPUFLEET_LDAP_ATTR_EMAIL: 'mail address' is not an attribute"),
    ({"GPUFLEET_LDAP_TIMEOUT": "0"}, r"GPUFLEET_LDAP_TIMEOUT='0' must be at least 1"),
])
def test_it_refuses_bad_values(environ, values, message):
    environ(**values)
    refused(message)


def test_a_ca_file_needs_tls(environ, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    environ(GPUFLEET_LDAP_START_TLS="false", GPUFLEET_LDAP_CA_FILE=str(ca))
    refused(r"GPUFLEET_LDAP_CA_FILE is set but nothing uses TLS")


def test_production_refuses_passwords_in_clear(environ, monkeypatch):
    environ(GPUFLEET_LDAP_START_TLS="false")
    monkeypatch.setenv("GPUFLEET_PRODUCTION", "true")
    refused(r"in clear.*GPUFLEET_LDAP_START_TLS=true or an ldaps:// URI")


def test_production_allows_a_directory_on_this_host_without_tls(environ, monkeypatch):
    environ(GPUFLEET_LDAP_URI="ldap://127.0.0.1:389 ldapi:///", GPUFLEET_LDAP_START_TLS="false")
    monkeypatch.setenv("GPUFLEET_PRODUCTION", "true")
    assert ldap_settings.read()["AUTH_LDAP_SERVER_URI"] == "ldap://127.0.0.1:389 ldapi:///"


def _start_site(**env: str) -> subprocess.CompletedProcess:
    """The site's own settings module, loaded in a process of its own with these variables."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("GPUFLEET_LDAP_")}
    base.update(DJANGO_SETTINGS_MODULE="gpufleet.settings", **env)
    code = ("import django; django.setup(); from django.conf import settings; "
            "print(settings.AUTHENTICATION_BACKENDS, settings.AUTH_LDAP_SERVER_URI)")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=120)


def test_the_site_logs_in_through_the_directory_once_a_uri_is_set():
    done = _start_site(**GOOD)
    assert done.returncode == 0, done.stderr
    assert "'gpufleet.sso.ldap.LDAPLoginBackend']" in done.stdout and "ldap://ldap.example.org" in done.stdout


def test_the_site_does_not_start_with_a_bad_value():
    done = _start_site(**{**GOOD, "GPUFLEET_LDAP_GROUP_TYPE": "ad"})
    assert done.returncode != 0
    assert "SettingError: GPUFLEET_LDAP_GROUP_TYPE: 'ad' is not one of" in done.stderr


def test_the_documented_configurations_are_read_as_they_are_shown(environ, monkeypatch, tmp_path):
    # The README's and docs/sso.md's LDAP blocks, as sh reads central.env, with their files made here.
    import shlex

    from tests.test_readme import readme_blocks

    blocks = [block for block in readme_blocks() if any(line.startswith("GPUFLEET_LDAP_URI=") for line in block)]
    assert len(blocks) >= 3  # OpenLDAP and Active Directory in docs/sso.md, Active Directory in the README
    for block in blocks:
        for name in [name for name in os.environ if name.startswith("GPUFLEET_LDAP_")]:
            monkeypatch.delenv(name)
        for line in block:
            for word in shlex.split(line, comments=True):
                name, _, value = word.partition("=")
                if name.endswith("_FILE"):
                    (tmp_path / name).write_text("from-the-file\n")
                    value = str(tmp_path / name)
                monkeypatch.setenv(name, value)
        got = ldap_settings.read()
        assert got["AUTH_LDAP_SERVER_URI"] == os.environ["GPUFLEET_LDAP_URI"]
        if "activeDirectory" in "\n".join(block):
            assert type(got["AUTH_LDAP_GROUP_TYPE"]) is NestedActiveDirectoryGroupType
            assert "sAMAccountName=%(user)s" in got["AUTH_LDAP_USER_SEARCH"].filterstr
