"""/api/teams/: members read their own teams, admins read every team and make, change
and delete them, audited as in the admin site."""

from __future__ import annotations

import json

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.teams.models import Team
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def _send(client, method: str, url: str, body: dict):
    return getattr(client, method)(url, json.dumps(body), content_type="application/json")


def test_a_member_reads_their_own_teams_only_and_an_admin_every_team(operator_client, admin_role_client, viewer_client, lab):
    Team.objects.create(name="vision")
    assert [t["name"] for t in operator_client.get("/api/teams/").json()["results"]] == ["lab"]
    assert operator_client.get("/api/teams/lab/").json() == {"name": "lab", "members": ["ada", "otto"], "leads": []}
    assert operator_client.get("/api/teams/vision/").status_code == 404
    assert [t["name"] for t in admin_role_client.get("/api/teams/").json()["results"]] == ["lab", "vision"]
    assert admin_role_client.get("/api/teams/vision/").json() == {"name": "vision", "members": [], "leads": []}
    assert viewer_client.get("/api/teams/").json()["results"] == []


def test_an_admin_makes_changes_and_deletes_a_team_audited(admin_role_client, operator, viewer):
    made = _send(admin_role_client, "post", "/api/teams/", {"name": "vision", "members": ["vera"], "leads": ["otto"]})
    assert made.status_code == 201
    assert made.json() == {"name": "vision", "members": ["otto", "vera"], "leads": ["otto"]}
    changed = _send(admin_role_client, "patch", "/api/teams/vision/", {"members": ["otto"]})
    assert changed.json() == {"name": "vision", "members": ["otto"], "leads": ["otto"]}
    renamed = _send(admin_role_client, "patch", "/api/teams/vision/", {"name": "sight", "leads": []})
    assert renamed.json() == {"name": "sight", "members": ["otto"], "leads": []}
    assert admin_role_client.delete("/api/teams/sight/").status_code == 204
    entries = list(AuditEntry.objects.filter(action__startswith="team.").order_by("pk"))
    assert [(e.action, e.username) for e in entries] == [
        ("team.create", "ada"), ("team.update", "ada"), ("team.update", "ada"), ("team.delete", "ada")]
    no_quotas = {"quotas": {"max_gpus": None, "max_gpus_by_model": {}, "gpu_hours_per_month": None,
                            "max_gpu_hours_ahead": None}}
    assert entries[1].before == {"name": "vision", "members": ["otto", "vera"], "leads": ["otto"], **no_quotas}
    assert entries[1].after == {"name": "vision", "members": ["otto"], "leads": ["otto"], **no_quotas}
    assert entries[3].before == {"name": "sight", "members": ["otto"], "leads": [], **no_quotas}
    assert not Team.objects.filter(name="sight").exists()


def test_only_admins_write_teams(operator_client, lab):
    assert _send(operator_client, "post", "/api/teams/", {"name": "vision"}).status_code == 403
    assert _send(operator_client, "patch", "/api/teams/lab/", {"name": "mine"}).status_code == 403
    assert operator_client.delete("/api/teams/lab/").status_code == 403
    assert list(Team.objects.values_list("name", flat=True)) == ["lab"]
    assert not AuditEntry.objects.exists()


def test_bad_team_writes_name_the_field_and_a_team_with_claims_stays(admin_role_client, operator, lab):
    taken = _send(admin_role_client, "post", "/api/teams/", {"name": "LAB"})
    assert (taken.status_code, taken.json()["error"]["field"]) == (422, "name")
    ghost = _send(admin_role_client, "post", "/api/teams/", {"name": "x", "members": ["ghost"]})
    assert (ghost.status_code, ghost.json()["error"]["field"]) == (422, "members")
    claim(make_node("alpha", 2), "train", operator, count=1)
    kept = admin_role_client.delete("/api/teams/lab/")
    assert (kept.status_code, kept.json()["error"]["code"]) == (409, "in_use")
    assert Team.objects.filter(name="lab").exists() and not AuditEntry.objects.filter(action="team.delete").exists()


def test_it_lists_teams_in_fixed_queries(admin_role_client, django_user_model, django_assert_num_queries):
    for i in range(6):
        team = Team.objects.create(name=f"t{i}")
        team.memberships.create(user=django_user_model.objects.create_user(f"u{i}"))
    # session, user, user perms, group perms, count, page, memberships, their users
    with django_assert_num_queries(8):
        assert len(admin_role_client.get("/api/teams/").json()["results"]) == 7
