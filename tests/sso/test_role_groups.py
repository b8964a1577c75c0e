"""GPUFLEET_SSO_ROLE_GROUPS read, and which role a person's groups give (pure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sso.groups import RoleGroupsError, matched_groups, parse_role_groups, role_for

REPO = Path(__file__).resolve().parents[2]
MAPPING = parse_role_groups(
    "admin=cn=gpu-admins,ou=groups,dc=example,dc=org;\n operator = gpu-operators ; viewer=/GPU-Users;"
)


def test_entries_are_role_then_group_and_a_dn_keeps_its_own_equals_signs():
    assert MAPPING.roles == {
        "cn=gpu-admins,ou=groups,dc=example,dc=org": "admin",
        "gpu-operators": "operator",
        "gpu-users": "viewer",
    }
    assert not parse_role_groups(" ; \n")


@pytest.mark.parametrize("groups, role", [
    (["CN=GPU-Admins, OU=Groups, DC=example, DC=org"], "admin"),
    (["cn=gpu-operators,ou=teams,dc=example,dc=org"], "operator"),  # a CN entry matches any DN it starts
    (["/gpu-operators"], "operator"),  # a Keycloak group path
    (["gpu-users", "gpu-operators", "unrelated"], "operator"),  # the highest wins
    (["gpu-admins"], None),  # the admin entry names a whole DN: a bare CN is not it
    (["cn=other,ou=gpu-operators,dc=example,dc=org"], None),  # only the first value counts
    ([], None),
])
def test_the_highest_role_of_the_groups(groups, role):
    assert role_for(groups, MAPPING) == role


def test_no_mapped_group_gives_the_default():
    assert role_for(["staff"], MAPPING, default="viewer") == "viewer"
    assert role_for(["gpu-operators"], MAPPING, default="viewer") == "operator"


def test_the_audit_names_only_the_mapped_groups():
    assert matched_groups(["staff", "/gpu-users", "gpu-operators"], MAPPING) == ["/gpu-users", "gpu-operators"]


@pytest.mark.parametrize("text, message", [
    ("gpu-operators", "is not role=group"),
    ("operator=", "is not role=group"),
    ("superuser=gpu-root", "'superuser' is not a role"),
    ("admin=ops; viewer=OPS", "mapped to both admin and viewer"),
])
def test_a_bad_mapping_says_which_entry(text, message):
    with pytest.raises(RoleGroupsError, match=message):
        parse_role_groups(text)


@pytest.mark.parametrize("variable, value, message", [
    ("GPUFLEET_SSO_ROLE_GROUPS", "root=wheel", "'root' is not a role"),
    ("GPUFLEET_SSO_DEFAULT_ROLE", "superuser", "'superuser' is not a role"),
    ("GPUFLEET_REMOTE_USER_HEADER", "X-Forwarded-User", "needs GPUFLEET_TRUSTED_PROXIES"),
])
def test_start_up_refuses_a_bad_setting(tmp_path, variable, value, message):
    env = {**os.environ, variable: value, "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("GPUFLEET_TRUSTED_PROXIES", None)
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert message in proc.stderr
