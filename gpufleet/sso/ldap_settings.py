"""LDAP / Active Directory login's settings: GPUFLEET_LDAP_* read from the environment and
turned into django-auth-ldap's AUTH_LDAP_* (docs/sso.md#ldap-and-active-directory).
gpufleet/settings.py takes them as they are; a bad value stops the start with a message
naming the variable, never a login that fails later for a reason nobody sees."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpufleet.env import SettingError, env_bool, env_float

# GPUFLEET_LDAP_GROUP_TYPE: django-auth-ldap's class for it, and the group search's filter
# unless GPUFLEET_LDAP_GROUP_FILTER says otherwise.
GROUP_TYPES = {
    "groupOfNames": ("GroupOfNamesType", "(objectClass=groupOfNames)"),
    "nestedGroupOfNames": ("NestedGroupOfNamesType", "(objectClass=groupOfNames)"),
    "groupOfUniqueNames": ("GroupOfUniqueNamesType", "(objectClass=groupOfUniqueNames)"),
    "posixGroup": ("PosixGroupType", "(objectClass=posixGroup)"),
    # Groups in groups followed by repeated member searches, which any Active Directory answers.
    "activeDirectory": ("NestedActiveDirectoryGroupType", "(objectClass=group)"),
}
_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "[::1]", "localhost"}


def read() -> dict[str, object]:
    """The settings for a directory at GPUFLEET_LDAP_URI; only that one (empty) without it."""
    uri = os.environ.get("GPUFLEET_LDAP_URI", "").strip()
    if not uri:
        return {"GPUFLEET_LDAP_URI": ""}
    import ldap
    from django_auth_ldap import config

    uris = uri.split()
    for one in uris:
        if not re.fullmatch(r"(ldap|ldaps|ldapi)://[^\s]*", one):
            raise SettingError(f"GPUFLEET_LDAP_URI: {one!r} is not an ldap://, ldaps:// or ldapi:// URI")
    start_tls = env_bool("GPUFLEET_LDAP_START_TLS", False)
    if start_tls and any(one.startswith("ldaps://") for one in uris):
        raise SettingError("GPUFLEET_LDAP_START_TLS=true is for ldap:// URIs; an ldaps:// URI is TLS already")
    ca_file = os.environ.get("GPUFLEET_LDAP_CA_FILE", "").strip()
    if ca_file:
        _readable("GPUFLEET_LDAP_CA_FILE", ca_file)
        if not start_tls and not any(one.startswith("ldaps://") for one in uris):
            raise SettingError("GPUFLEET_LDAP_CA_FILE is set but nothing uses TLS: set GPUFLEET_LDAP_START_TLS=true "
                               "or use an ldaps:// URI")
    in_clear = [one for one in uris if one.startswith("ldap://") and _host(one) not in _LOOPBACK_HOSTS]
    if in_clear and not start_tls and env_bool("GPUFLEET_PRODUCTION", False):
        raise SettingError(f"GPUFLEET_LDAP_URI {in_clear[0]} would carry passwords in clear: set "
                           "GPUFLEET_LDAP_START_TLS=true or an ldaps:// URI")

    bind_dn, bind_password = _bind()
    user_base = env_dn("GPUFLEET_LDAP_USER_SEARCH_BASE", required="the directory is searched there for the login name")
    user_filter = env_filter("GPUFLEET_LDAP_USER_FILTER", "(uid=%(user)s)", user=True)
    group_base = env_dn("GPUFLEET_LDAP_GROUP_SEARCH_BASE", required="roles come from the groups found there")
    type_name = os.environ.get("GPUFLEET_LDAP_GROUP_TYPE", "").strip() or "groupOfNames"
    known = {name.lower(): name for name in GROUP_TYPES}
    if type_name.lower() not in known:
        raise SettingError(f"GPUFLEET_LDAP_GROUP_TYPE: {type_name!r} is not one of {', '.join(GROUP_TYPES)}")
    group_class, group_filter = GROUP_TYPES[known[type_name.lower()]]
    group_filter = env_filter("GPUFLEET_LDAP_GROUP_FILTER", group_filter)

    attrs = {field: value for field, value in (
        ("email", env_attribute("GPUFLEET_LDAP_ATTR_EMAIL", "mail")),
        ("first_name", env_attribute("GPUFLEET_LDAP_ATTR_FIRST_NAME", "givenName")),
        ("last_name", env_attribute("GPUFLEET_LDAP_ATTR_LAST_NAME", "sn")),
    ) if value}
    attrlist = list(attrs.values())
    if group_class == "PosixGroupType":
        attrlist += ["uid", "gidNumber"]  # what a posixGroup's members are found by

    timeout = env_float("GPUFLEET_LDAP_TIMEOUT", 10.0, minimum=1.0)
    options = {
        # Active Directory's referrals lead to servers that refuse an unbound search.
        ldap.OPT_REFERRALS: 0,
        ldap.OPT_NETWORK_TIMEOUT: timeout,
        ldap.OPT_TIMEOUT: timeout,
        # The directory's certificate is always checked, whatever /etc/ldap/ldap.conf says.
        ldap.OPT_X_TLS_REQUIRE_CERT: ldap.OPT_X_TLS_DEMAND,
    }
    if ca_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    # Last: a new TLS context of this connection's own, made from the options above.
    options[ldap.OPT_X_TLS_NEWCTX] = 0

    return {
        "GPUFLEET_LDAP_URI": uri,
        "GPUFLEET_LDAP_ATTRS": attrs,
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_USER_SEARCH": config.LDAPSearch(user_base, ldap.SCOPE_SUBTREE, user_filter, attrlist=attrlist),
        "AUTH_LDAP_USER_ATTRLIST": attrlist,
        "AUTH_LDAP_GROUP_SEARCH": config.LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_filter),
        "AUTH_LDAP_GROUP_TYPE": getattr(config, group_class)(),
        # A person's groups are asked for at every login: removed from one, they lose its role then.
        "AUTH_LDAP_CACHE_TIMEOUT": 0,
        # Roles come from GPUFLEET_SSO_ROLE_GROUPS through gpufleet.sso, never from the library.
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_MIRROR_GROUPS": False,
    }


def _bind() -> tuple[str, str]:
    """The account the user search binds as; none for an anonymous search."""
    dn = os.environ.get("GPUFLEET_LDAP_BIND_DN", "").strip()
    password = os.environ.get("GPUFLEET_LDAP_BIND_PASSWORD", "")
    password_file = os.environ.get("GPUFLEET_LDAP_BIND_PASSWORD_FILE", "").strip()
    if password and password_file:
        raise SettingError("set GPUFLEET_LDAP_BIND_PASSWORD or GPUFLEET_LDAP_BIND_PASSWORD_FILE, not both")
    if password_file:
        password = _readable("GPUFLEET_LDAP_BIND_PASSWORD_FILE", password_file).rstrip("\r\n")
    if dn:
        # Active Directory also binds by user principal name (svc-gpufleet@corp.example.com).
        if not re.fullmatch(r"[^@=,\s]+@[^@=,\s]+", dn):
            _check_dn("GPUFLEET_LDAP_BIND_DN", dn)
        if not password:
            raise SettingError("GPUFLEET_LDAP_BIND_DN needs a password: GPUFLEET_LDAP_BIND_PASSWORD or "
                               "GPUFLEET_LDAP_BIND_PASSWORD_FILE")
    elif password:
        raise SettingError("GPUFLEET_LDAP_BIND_PASSWORD is set without GPUFLEET_LDAP_BIND_DN (whose password is it?)")
    return dn, password


def env_dn(name: str, required: str) -> str:
    """A DN that must be set; `required` says why, in the message when it is not."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise SettingError(f"{name} must be set with GPUFLEET_LDAP_URI: {required}")
    _check_dn(name, value)
    return value


def _check_dn(name: str, value: str) -> None:
    import ldap.dn

    if "=" not in value or not ldap.dn.is_dn(value):
        raise SettingError(f"{name}: {value!r} is not a DN (for example ou=people,dc=example,dc=org)")


def env_filter(name: str, default: str, user: bool = False) -> str:
    """An LDAP search filter in balanced parentheses; with `user`, one that holds %(user)s."""
    value = os.environ.get(name, "").strip() or default
    depth = 0
    for char in value:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if not (value.startswith("(") and value.endswith(")")) or depth != 0:
        raise SettingError(f"{name}: {value!r} is not an LDAP filter in balanced parentheses")
    if user and "%(user)s" not in value:
        raise SettingError(f"{name}: {value!r} must hold %(user)s where the login name goes, "
                           "for example (uid=%(user)s)")
    try:
        value % {"user": "x"}
    except (ValueError, TypeError, KeyError):
        raise SettingError(f"{name}: {value!r} holds a % that is not %(user)s; write a literal % as %%") from None
    return value


def env_attribute(name: str, default: str) -> str:
    """An attribute name; empty (set so) maps nothing."""
    value = os.environ.get(name, default).strip()
    if value and not _ATTRIBUTE.fullmatch(value):
        raise SettingError(f"{name}: {value!r} is not an attribute name (for example mail); empty maps nothing")
    return value


def _readable(name: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingError(f"{name}: cannot read {path!r} ({error.__class__.__name__})") from None


def _host(uri: str) -> str:
    rest = uri.split("://", 1)[1].split("/", 1)[0]
    host = rest.rsplit("@", 1)[-1]
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host
