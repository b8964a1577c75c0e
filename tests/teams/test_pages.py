"""The teams pages: my teams (every team for admins), and one team with its members,
leads and claims now and booked ahead; a team of someone else's is not there."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims import services
from gpufleet.teams.models import Team
from tests.claims.helpers import claim, make_node

pytestmark = pytest.mark.django_db


def test_the_list_shows_my_teams_and_an_admin_every_team(operator_client, admin_role_client, viewer_client, lab):
    Team.objects.create(name="vision")
    assert re.findall(r'href="/teams/(\w+)/"', operator_client.get("/teams/").content.decode()) == ["lab"]
    assert re.findall(r'href="/teams/(\w+)/"', admin_role_client.get("/teams/").content.decode()) == ["lab", "vision"]
    assert "You are in no team yet" in viewer_client.get("/teams/").content.decode()


def test_a_team_page_shows_members_leads_and_claims_now_and_ahead(operator_client, operator, admin_user, lab):
    lab.memberships.filter(user=admin_user).update(lead=True)
    node = make_node("alpha", 4)
    claim(node, "train", operator, count=1)
    later = timezone.now() + timedelta(days=1)
    services.save_claim(node, gpu.Claim("lab-day", count=2), operator,
                        terms=services.Terms(owner=operator, starts_at=later, ends_at=later + timedelta(hours=8)))
    html = operator_client.get("/teams/lab/").content.decode()
    members = re.search(r'<section id="team-members".*?</section>', html, re.S).group(0)
    assert "ada <strong>(lead)</strong>" in members and "otto" in members
    now = re.search(r'<section id="team-claims-now".*?</section>', html, re.S).group(0)
    ahead = re.search(r'<section id="team-claims-ahead".*?</section>', html, re.S).group(0)
    assert "train" in now and "lab-day" not in now
    assert "lab-day" in ahead and "train" not in ahead


def test_a_team_of_someone_elses_is_not_found_but_an_admin_reads_it(operator_client, admin_role_client, lab):
    Team.objects.create(name="vision")
    assert operator_client.get("/teams/vision/").status_code == 404
    assert operator_client.get("/teams/nosuch/").status_code == 404
    assert admin_role_client.get("/teams/vision/").status_code == 200


def test_outsiders_get_no_team_page(outsider, lab):
    from django.test import Client

    client = Client()
    client.force_login(outsider)
    assert client.get("/teams/").status_code == 403
    assert client.get("/teams/lab/").status_code == 403
