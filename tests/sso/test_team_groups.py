"""GPUFLEET_SSO_TEAM_GROUPS read, and which teams a person's groups give (pure)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sso.groups import TEAM_NAME_MAX_LENGTH, TeamGroupsError, matched_groups, parse_team_groups, teams_for

REPO = Path(__file__).resolve().parents[2]
MAPPING = parse_team_groups(
    "vision=cn=gpu-vision,ou=groups,dc=example,dc=org;\n Vision = /vision-students ;"
    " lead:vision=vision-leads; nlp=gpu-nlp; speech=gpu-nlp; LEAD : nlp = gpu-nlp-leads;"
)


def test_entries_are_team_then_group_and_a_group_may_give_several_teams():
    assert MAPPING.teams == {
        "cn=gpu-vision,ou=groups,dc=example,dc=org": {"vision": False},
        "vision-students": {"vision": False},
        "vision-leads": {"vision": True},
        "gpu-nlp": {"nlp": False, "speech": False},
        "gpu-nlp-leads": {"nlp": True},
    }
    assert not parse_team_groups(" ; \n")


@pytest.mark.parametrize("groups, teams", [
    (["CN=GPU-Vision, OU=Groups, DC=example, DC=org"], {"vision": False}),
    (["cn=vision-students,ou=courses,dc=example,dc=org"], {"vision": False}),  # a CN entry matches any DN it starts
    (["/gpu-nlp"], {"nlp": False, "speech": False}),  # a Keycloak group path
    (["gpu-nlp", "gpu-nlp-leads", "vision-students"], {"nlp": True, "speech": False, "vision": False}),
    (["vision-leads"], {"vision": True}),  # a lead is a member too
    (["gpu-vision"], {}),  # the entry names a whole DN: a bare CN is not it
    (["staff"], {}),
    ([], {}),
])
def test_the_teams_of_the_groups(groups, teams):
    assert teams_for(groups, MAPPING) == teams


def test_a_team_is_spelt_as_its_first_entry_spells_it():
    assert teams_for(["a", "b"], parse_team_groups("ML-Ops=a; lead:ml-ops=b")) == {"ML-Ops": True}


def test_the_audit_names_only_the_mapped_groups():
    assert matched_groups(["staff", "/gpu-nlp", "vision-leads"], MAPPING) == ["/gpu-nlp", "vision-leads"]


def test_a_team_name_fits_a_team():
    from gpufleet.teams.models import Team

    assert Team._meta.get_field("name").max_length == TEAM_NAME_MAX_LENGTH


@pytest.mark.parametrize("text, message", [
    ("gpu-vision", "'gpu-vision' is not team=group"),
    ("vision=", "'vision=' is not team=group"),
    ("=gpu-vision", "'=gpu-vision' is not team=group"),
    ("lead:=gpu-vision", "'lead:=gpu-vision' is not team=group"),
    ("leads:vision=gpu-vision", "'leads:vision=gpu-vision': only lead: may come before a team"),
    ("x" * (TEAM_NAME_MAX_LENGTH + 1) + "=g", f"longer than {TEAM_NAME_MAX_LENGTH} characters"),
])
def test_a_bad_mapping_says_which_entry(text, message):
    with pytest.raises(TeamGroupsError, match=message):
        parse_team_groups(text)


def test_start_up_refuses_a_bad_setting(tmp_path):
    env = {**os.environ, "GPUFLEET_SSO_TEAM_GROUPS": "vision=gpu-vision; gpu-nlp", "GPUFLEET_DATA_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "GPUFLEET_SSO_TEAM_GROUPS: 'gpu-nlp' is not team=group" in proc.stderr
