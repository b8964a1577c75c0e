"""Which role a directory's groups give: GPUFLEET_SSO_ROLE_GROUPS read once, and the
highest role any of a person's groups maps to. Pure: the LDAP, OIDC and proxy logins
hand it the group names they were given."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Lowest first: a person in several mapped groups gets the highest of their roles.
ROLES = ("viewer", "operator", "admin")


class RoleGroupsError(ValueError):
    """GPUFLEET_SSO_ROLE_GROUPS (or the default role) cannot be read; says which entry."""


@dataclass(frozen=True)
class RoleGroups:
    """Each mapped group's key (see `group_keys`) with the role it gives."""

    roles: dict[str, str]

    def __bool__(self) -> bool:
        return bool(self.roles)


def parse_role_groups(text: str) -> RoleGroups:
    """`role=group` entries separated by `;` or new lines. A group is an LDAP DN (which
    holds `=` and `,` itself: only the first `=` ends the role), a CN or a group name."""
    roles: dict[str, str] = {}
    for entry in text.replace("\n", ";").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        role, separator, group = (part.strip() for part in entry.partition("="))
        if not separator or not group:
            raise RoleGroupsError(f"{entry!r} is not role=group (for example operator=gpu-operators)")
        role = parse_role(role)
        key = _key(group)
        if roles.get(key, role) != role:
            raise RoleGroupsError(f"group {group!r} is mapped to both {roles[key]} and {role}")
        roles[key] = role
    return RoleGroups(roles)


def parse_role(text: str) -> str:
    role = text.strip().lower()
    if role not in ROLES:
        raise RoleGroupsError(f"{text!r} is not a role: use one of {', '.join(ROLES)}")
    return role


def role_for(groups: Iterable[str], role_groups: RoleGroups, default: str | None = None) -> str | None:
    """The highest role a group of `groups` maps to; `default` when none does (None: no access)."""
    found = {role_groups.roles[key] for group in groups for key in group_keys(group) if key in role_groups.roles}
    if not found:
        return default
    return max(found, key=ROLES.index)


def matched_groups(groups: Iterable[str], role_groups: RoleGroups) -> list[str]:
    """The groups of `groups` that the mapping names, for the audit row."""
    return sorted({group for group in groups if any(key in role_groups.roles for key in group_keys(group))})


def group_keys(group: str) -> set[str]:
    """What a group given by a directory is matched by: its whole name and, for a DN
    (cn=gpu-operators,ou=groups,...), its first value (gpu-operators), so a mapping may
    name either; case-insensitive, as LDAP compares them, and without the leading `/` of
    a Keycloak group path."""
    key = _key(group)
    keys = {key}
    first, separator, _ = key.partition(",")
    name, is_rdn, value = first.partition("=")
    if separator and is_rdn and value:
        keys.add(value.strip())
    return keys


def _key(group: str) -> str:
    return ",".join(part.strip() for part in group.strip().lstrip("/").lower().split(","))
