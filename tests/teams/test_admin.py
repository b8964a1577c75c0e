"""Teams are made and filled in the admin site by the admin role, audited."""

from __future__ import annotations

import pytest

from gpufleet.audit.models import AuditEntry
from gpufleet.teams.models import Team

pytestmark = pytest.mark.django_db

NO_QUOTAS = {"max_gpus": None, "max_gpus_by_model": {}, "gpu_hours_per_month": None, "max_gpu_hours_ahead": None}


def _add_team(client, quotas: dict | None = None, **members):
    data = {"name": "vision", "memberships-TOTAL_FORMS": str(len(members)), "memberships-INITIAL_FORMS": "0",
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000", **(quotas or {})}
    for i, (user, lead) in enumerate(members.items()):
        data[f"memberships-{i}-user"] = str(user)
        if lead:
            data[f"memberships-{i}-lead"] = "on"
    return client.post("/admin/teams/team/add/", data)


def test_an_admin_makes_a_team_with_a_lead_and_the_audit_log_names_them(admin_role_client, admin_user, operator):
    response = _add_team(admin_role_client, **{str(operator.pk): True, str(admin_user.pk): False})
    assert response.status_code == 302, response.content.decode()[:2000]
    team = Team.objects.get(name="vision")
    assert sorted(team.members.values_list("username", flat=True)) == ["ada", "otto"]
    entry = AuditEntry.objects.get(action="team.create")
    assert entry.username == "ada"
    assert entry.after == {"name": "vision", "members": ["ada", "otto"], "leads": ["otto"], "quotas": NO_QUOTAS}


def test_an_operator_cannot_make_teams(operator_client):
    assert _add_team(operator_client).status_code in (302, 403)
    assert not Team.objects.filter(name="vision").exists()


def test_deleting_a_team_is_audited_with_its_members(admin_role_client, operator):
    team = Team.objects.create(name="vision")
    team.memberships.create(user=operator, lead=True)
    response = admin_role_client.post(f"/admin/teams/team/{team.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert AuditEntry.objects.get(action="team.delete").before == {
        "name": "vision", "members": ["otto"], "leads": ["otto"], "quotas": NO_QUOTAS}


def test_an_admin_sets_a_teams_quotas_and_the_audit_shows_them(admin_role_client):
    response = _add_team(admin_role_client, {"max_gpus": "8", "max_gpus_by_model": '{"H100": 4}',
                                             "gpu_hours_per_month": "2000"})
    assert response.status_code == 302, response.content.decode()[:2000]
    team = Team.objects.get(name="vision")
    assert (team.max_gpus, team.max_gpus_by_model, team.gpu_hours_per_month, team.max_gpu_hours_ahead) == (
        8, {"H100": 4}, 2000, None)
    assert AuditEntry.objects.get(action="team.create").after["quotas"] == {
        "max_gpus": 8, "max_gpus_by_model": {"H100": 4}, "gpu_hours_per_month": 2000, "max_gpu_hours_ahead": None}


@pytest.mark.parametrize("by_model", ['["H100"]', '{"H100": -1}', '{"H100": "4"}', '{"": 4}'])
def test_a_quota_by_model_must_give_each_model_a_number_of_gpus(admin_role_client, by_model):
    response = _add_team(admin_role_client, {"max_gpus_by_model": by_model})
    assert response.status_code == 200
    assert "Give each model its most GPUs" in response.content.decode()
    assert not Team.objects.filter(name="vision").exists()
