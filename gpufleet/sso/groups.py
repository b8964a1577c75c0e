"""Which role and which teams a directory's groups give: GPUFLEET_SSO_ROLE_GROUPS and
GPUFLEET_SSO_TEAM_GROUPS read once, the highest role any of a person's groups maps to and
every team they map to. Pure: the LDAP, OIDC and proxy logins hand it the group names
they were given."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Lowest first: a person in several mapped groups gets the highest of their roles.
ROLES = ("viewer", "operator", "admin")
# Team.name's max_length (gpufleet/teams/models.py; a test holds them equal): a longer
# name in the mapping fails at start-up, not at someone's login.
TEAM_NAME_MAX_LENGTH = 100
# Before a team in GPUFLEET_SSO_TEAM_GROUPS: the group's members are the team's leads.
LEAD_PREFIX = "lead"


class RoleGroupsError(ValueError):
    """GPUFLEET_SSO_ROLE_GROUPS (or the default role) cannot be read; says which entry."""


@dataclass(frozen=True)
class RoleGroups:
    """Each mapped group's key (see `group_keys`) with the role it gives."""

    roles: dict[str, str]

    def __bool__(self) -> bool:
        return bool(self.roles)

    def __contains__(self, key: str) -> bool:
        return key in self.roles


class TeamGroupsError(ValueError):
    """GPUFLEET_SSO_TEAM_GROUPS cannot be read; says which entry."""


@dataclass(frozen=True)
class TeamGroups:
    """Each mapped group's key (see `group_keys`) with the teams it gives, each team's name
    with whether the group's members are its leads."""

    teams: dict[str, dict[str, bool]]

    def __bool__(self) -> bool:
        return bool(self.teams)

    def __contains__(self, key: str) -> bool:
        return key in self.teams


def parse_role_groups(text: str) -> RoleGroups:
    """`role=group` entries separated by `;` or new lines. A group is an LDAP DN (which
    holds `=` and `,` itself: only the first `=` ends the role), a CN or a group name."""
    roles: dict[str, str] = {}
    for entry in _entries(text):
        role, separator, group = (part.strip() for part in entry.partition("="))
        if not separator or not group:
            raise RoleGroupsError(f"{entry!r} is not role=group (for example operator=gpu-operators)")
        role = parse_role(role)
        key = _key(group)
        if roles.get(key, role) != role:
            raise RoleGroupsError(f"group {group!r} is mapped to both {roles[key]} and {role}")
        roles[key] = role
    return RoleGroups(roles)


def parse_team_groups(text: str) -> TeamGroups:
    """`team=group` entries, and `lead:team=group` for a group whose members are the team's
    leads, separated by `;` or new lines, as `parse_role_groups` reads them. A group may give
    several teams and a team may come from several groups; a team is named as its first
    entry spells it (teams are one whatever the case of their name)."""
    teams: dict[str, dict[str, bool]] = {}
    spelling: dict[str, str] = {}
    for entry in _entries(text):
        team, separator, group = (part.strip() for part in entry.partition("="))
        prefix, is_prefixed, name = (part.strip() for part in team.rpartition(":"))
        if is_prefixed and prefix.lower() != LEAD_PREFIX:
            raise TeamGroupsError(f"{entry!r}: only {LEAD_PREFIX}: may come before a team "
                                  f"(for example {LEAD_PREFIX}:vision=gpu-vision-leads)")
        if not separator or not group or not name:
            raise TeamGroupsError(f"{entry!r} is not team=group (for example vision=gpu-vision, "
                                  f"or {LEAD_PREFIX}:vision=gpu-vision-leads)")
        if len(name) > TEAM_NAME_MAX_LENGTH:
            raise TeamGroupsError(f"{entry!r}: a team's name is longer than {TEAM_NAME_MAX_LENGTH} characters")
        name = spelling.setdefault(name.lower(), name)
        given = teams.setdefault(_key(group), {})
        given[name] = given.get(name, False) or bool(is_prefixed)
    return TeamGroups(teams)


def teams_for(groups: Iterable[str], team_groups: TeamGroups) -> dict[str, bool]:
    """Every team a group of `groups` maps to, with whether one of them makes the person its lead."""
    found: dict[str, bool] = {}
    for group in groups:
        for key in group_keys(group):
            for name, lead in team_groups.teams.get(key, {}).items():
                found[name] = found.get(name, False) or lead
    return found


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


def matched_groups(groups: Iterable[str], mapping: RoleGroups | TeamGroups) -> list[str]:
    """The groups of `groups` that the mapping names, for the audit row."""
    return sorted({group for group in groups if any(key in mapping for key in group_keys(group))})


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


def _entries(text: str) -> list[str]:
    """A mapping's entries: separated by `;` or new lines, blank ones skipped."""
    return [entry.strip() for entry in text.replace("\n", ";").split(";") if entry.strip()]


def _key(group: str) -> str:
    return ",".join(part.strip() for part in group.strip().lstrip("/").lower().split(","))
