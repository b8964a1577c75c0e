"""/api/teams/: members read their own teams, admins read every team and make, change
and delete them, audited as in the admin site."""

from __future__ import annotations

import json

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.teams.models import Team
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


NO_LIMITS = {"max_gpus": None, "max_gpus_by_model": {}, "gpu_hours_per_month": None, "max_gpu_hours_ahead": None}


def _send(client, method: str, url: str, body: dict):
    return getattr(client, method)(url, json.dumps(body), content_type="application/json")


def test_a_member_reads_their_own_teams_only_and_an_admin_every_team(operator_client, admin_role_client, viewer_client, lab):
    Team.objects.create(name="vision")
    assert [t["name"] for t in operator_client.get("/api/teams/").json()["results"]] == ["lab"]
    assert operator_client.get("/api/teams/lab/").json() == {"name": "lab", "members": ["ada", "otto"], "leads": [],
                                                            **NO_LIMITS}
    assert operator_client.get("/api/teams/vision/").status_code == 404
    assert [t["name"] for t in admin_role_client.get("/api/teams/").json()["results"]] == ["lab", "vision"]
    assert admin_role_client.get("/api/teams/vision/").json() == {"name": "vision", "members": [], "leads": [], **NO_LIMITS}
    assert viewer_client.get("/api/teams/").json()["results"] == []


def test_an_admin_makes_changes_and_deletes_a_team_audited(admin_role_client, operator, viewer):
    made = _send(admin_role_client, "post", "/api/teams/", {"name": "vision", "members": ["vera"], "leads": ["otto"]})
    assert made.status_code == 201
    assert made.json() == {"name": "vision", "members": ["otto", "vera"], "leads": ["otto"], **NO_LIMITS}
    changed = _send(admin_role_client, "patch", "/api/teams/vision/", {"members": ["otto"]})
    assert changed.json() == {"name": "vision", "members": ["otto"], "leads": ["otto"], **NO_LIMITS}
    renamed = _send(admin_role_client, "patch", "/api/teams/vision/", {"name": "sight", "leads": []})
    assert renamed.json() == {"name": "sight", "members": ["otto"], "leads": [], **NO_LIMITS}
    assert admin_role_client.delete("/api/teams/sight/").status_code == 204
    entries = list(AuditEntry.objects.filter(action__startswith="team.").order_by("pk"))
    assert [(e.action, e.username) for e in entries] == [
        ("team.create", "ada"), ("team.update", "ada"), ("team.update", "ada"), ("team.delete", "ada")]
    no_quotas = {"quotas": NO_LIMITS}
    assert entries[1].before == {"name": "vision", "members": ["otto", "vera"], "leads": ["otto"], **no_quotas}
    assert entries[1].after == {"name": "vision", "members": ["otto"], "leads": ["otto"], **no_quotas}
    assert entries[3].before == {"name": "sight", "members": ["otto"], "leads": [], **no_quotas}
    assert not Team.objects.filter(name="sight").exists()


def test_an_admin_sets_and_clears_quotas_audited_and_a_member_reads_them(admin_role_client, operator_client, lab):
    quotas = {"max_gpus": 8, "max_gpus_by_model": {"H100": 4}, "gpu_hours_per_month": 1000, "max_gpu_hours_ahead": 200}
    made = _send(admin_role_client, "post", "/api/teams/", {"name": "vision", **quotas})
    assert (made.status_code, made.json()) == (201, {"name": "vision", "members": [], "leads": [], **quotas})
    # Left out: as it is; null: no limit.
    cleared = _send(admin_role_client, "patch", "/api/teams/lab/", {"max_gpus": 4, "max_gpus_by_model": {"A100": 2}})
    assert cleared.status_code == 200
    cleared = _send(admin_role_client, "patch", "/api/teams/lab/", {"max_gpus_by_model": None, "gpu_hours_per_month": 50})
    lab_quotas = {**NO_LIMITS, "max_gpus": 4, "gpu_hours_per_month": 50}
    assert cleared.json() == {"name": "lab", "members": ["ada", "otto"], "leads": [], **lab_quotas}
    assert _send(admin_role_client, "patch", "/api/teams/lab/", {"max_gpus": None}).json()["max_gpus"] is None
    assert operator_client.get("/api/teams/lab/").json() == {
        "name": "lab", "members": ["ada", "otto"], "leads": [], **NO_LIMITS, "gpu_hours_per_month": 50}
    assert [t["gpu_hours_per_month"] for t in operator_client.get("/api/teams/").json()["results"]] == [50]
    entries = list(AuditEntry.objects.filter(action__startswith="team.").order_by("pk"))
    assert [e.action for e in entries] == ["team.create", "team.update", "team.update", "team.update"]
    assert entries[0].after["quotas"] == quotas
    assert entries[2].before["quotas"] == {**NO_LIMITS, "max_gpus": 4, "max_gpus_by_model": {"A100": 2}}
    assert entries[2].after["quotas"] == lab_quotas
    assert entries[3].after["quotas"] == {**NO_LIMITS, "gpu_hours_per_month": 50}


def test_only_admins_write_teams(operator_client, lab):
    assert _send(operator_client, "post", "/api/teams/", {"name": "vision"}).status_code == 403
    assert _send(operator_client, "patch", "/api/teams/lab/", {"name": "mine"}).status_code == 403
    assert _send(operator_client, "patch", "/api/teams/lab/", {"max_gpus": 100}).status_code == 403
    assert Team.objects.get(name="lab").max_gpus is None
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


@pytest.mark.parametrize(("body", "field"), [
    ({"max_gpus": -1}, "max_gpus"),
    ({"gpu_hours_per_month": -5}, "gpu_hours_per_month"),
    ({"max_gpu_hours_ahead": "ten"}, "max_gpu_hours_ahead"),
    ({"max_gpus_by_model": {"H100": -2}}, "max_gpus_by_model"),
    ({"max_gpus_by_model": {"H100": "8"}}, "max_gpus_by_model"),
    ({"max_gpus_by_model": {" ": 8}}, "max_gpus_by_model"),
    ({"max_gpus_by_model": ["H100"]}, "max_gpus_by_model"),
])
def test_bad_quotas_are_refused_naming_the_field_and_nothing_is_saved(admin_role_client, lab, body, field):
    for method, url in [("post", "/api/teams/"), ("patch", "/api/teams/lab/")]:
        refused = _send(admin_role_client, method, url, {"name": "vision", **body} if method == "post" else body)
        assert refused.status_code == 422, refused.json()
        assert refused.json()["error"]["field"] == field
        assert refused.json()["error"]["message"].startswith(f"{field}: ")
    assert list(Team.objects.values_list("name", flat=True)) == ["lab"]
    assert Team.objects.get(name="lab").quota() == Team().quota()
    assert not AuditEntry.objects.exists()


def test_a_bad_model_quota_says_how_to_give_one(admin_role_client, lab):
    refused = _send(admin_role_client, "patch", "/api/teams/lab/", {"max_gpus_by_model": {"H100": -2}})
    assert refused.json()["error"] == {"code": "invalid", "field": "max_gpus_by_model",
                                       "message": 'max_gpus_by_model: Give each model its most GPUs, as {"H100": 8}.'}


def test_it_lists_teams_in_fixed_queries(admin_role_client, django_user_model, django_assert_num_queries):
    for i in range(6):
        team = Team.objects.create(name=f"t{i}")
        team.memberships.create(user=django_user_model.objects.create_user(f"u{i}"))
    # session, user, user perms, group perms, count, page, memberships, their users
    with django_assert_num_queries(8):
        assert len(admin_role_client.get("/api/teams/").json()["results"]) == 7
