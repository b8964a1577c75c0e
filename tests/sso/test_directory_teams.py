"""Teams from the directory's groups (GPUFLEET_SSO_TEAM_GROUPS): at every login and every
time the directory is asked again, a person's directory memberships become what their groups
give (teams made when missing); the memberships an admin added by hand stay as they are."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from gpufleet.audit.models import Action, AuditEntry
from gpufleet.sso import services
from gpufleet.sso.groups import parse_team_groups
from gpufleet.sso.models import Identity
from gpufleet.teams.models import Membership, Team
from tests.sso import ldap_server, provider
from tests.sso.ldap_server import GROUPS
from tests.sso.test_ldap_login import log_in as ldap_log_in
from tests.sso.test_oidc_login import log_in as oidc_log_in
from tests.sso.test_recheck import later
from tests.sso.test_sign_in import SETTINGS as PROXY_SETTINGS
from tests.sso.test_sign_in import through_proxy

directory, ldap_site = ldap_server.directory, ldap_server.ldap_site
openid_provider = provider.openid_provider

TEAM_GROUPS = "vision=gpu-vision; lead:vision=vision-leads; nlp=gpu-nlp; speech=gpu-nlp"


@pytest.fixture
def proxy(settings, db):
    for name, value in PROXY_SETTINGS.items():
        setattr(settings, name, value)
    settings.GPUFLEET_SSO_TEAM_GROUPS = parse_team_groups(TEAM_GROUPS)


def memberships(username: str) -> dict[str, tuple[bool, bool]]:
    """Each team of the person: (lead, from the directory)."""
    rows = Membership.objects.filter(user__username=username).select_related("team")
    return {row.team.name: (row.lead, row.from_directory) for row in rows}


def team_changes(username: str) -> list[tuple[dict, dict]]:
    rows = AuditEntry.objects.filter(action=Action.SSO_TEAMS, target=username).order_by("id")
    return [(row.before, row.after) for row in rows]


def by_hand(username: str, team: str, lead: bool = False) -> None:
    Membership.objects.create(user=User.objects.get(username=username), team=Team.objects.get_or_create(name=team)[0],
                              lead=lead)


def test_a_login_gives_the_teams_of_the_groups_making_missing_ones_and_audits_them(proxy, alpha):
    Team.objects.create(name="NLP")
    assert through_proxy(Client(), "/", "alice", "gpu-operators, gpu-nlp, vision-leads, staff").status_code == 200

    assert memberships("alice") == {"NLP": (False, True), "speech": (False, True), "vision": (True, True)}
    assert sorted(Team.objects.values_list("name", flat=True)) == ["NLP", "speech", "vision"]
    assert team_changes("alice") == [(
        {"teams": [], "leads": []},
        {"source": "proxy", "groups": ["gpu-nlp", "vision-leads"], "teams": ["NLP", "speech", "vision"],
         "leads": ["vision"]},
    )]
    made = AuditEntry.objects.filter(action=Action.TEAM_CREATE).order_by("target")
    assert [(row.target, row.after["source"]) for row in made] == [("speech", "proxy"), ("vision", "proxy")]


def test_out_of_the_group_the_next_login_leaves_the_team_and_hand_added_memberships_stay(proxy, alpha):
    through_proxy(Client(), "/", "alice", "gpu-operators, gpu-vision, gpu-nlp")
    by_hand("alice", "infra", lead=True)
    # An admin's membership in a team the groups give too stays the admin's, as set.
    Membership.objects.filter(user__username="alice", team__name="nlp").update(from_directory=False, lead=True)

    through_proxy(Client(), "/", "alice", "gpu-operators, vision-leads")
    assert memberships("alice") == {"infra": (True, False), "nlp": (True, False), "vision": (True, True)}

    through_proxy(Client(), "/", "alice", "gpu-operators")
    assert memberships("alice") == {"infra": (True, False), "nlp": (True, False)}
    before, after = team_changes("alice")[-1]
    assert before == {"teams": ["vision"], "leads": ["vision"]} and (after["teams"], after["leads"]) == ([], [])
    assert Team.objects.filter(name="vision").exists()  # the team stays, for its claims and other members


def test_a_person_in_no_mapped_team_group_keeps_no_directory_membership(proxy, alpha, settings):
    through_proxy(Client(), "/", "bob", "gpu-users, staff")
    assert memberships("bob") == {} and team_changes("bob") == []

    # A team the mapping no longer names goes at the next login too.
    through_proxy(Client(), "/", "bob", "gpu-users, gpu-vision")
    settings.GPUFLEET_SSO_TEAM_GROUPS = parse_team_groups("")
    through_proxy(Client(), "/", "bob", "gpu-users, gpu-vision")
    assert memberships("bob") == {}


def test_a_proxys_changed_groups_header_changes_the_teams_at_the_next_request(proxy, alpha):
    client = Client()
    through_proxy(client, "/", "alice", "gpu-operators, gpu-vision")
    assert memberships("alice") == {"vision": (False, True)}
    assert through_proxy(client, "/", "alice", "gpu-operators, gpu-nlp").status_code == 200
    assert memberships("alice") == {"nlp": (False, True), "speech": (False, True)}


def test_asked_again_the_directorys_answer_replaces_the_teams(proxy, alpha):
    through_proxy(Client(), "/", "alice", "gpu-operators, gpu-vision, gpu-nlp")
    by_hand("alice", "infra")
    identity = Identity.objects.get(user__username="alice")

    assert services.follow(identity, ["gpu-operators", "vision-leads"])
    assert memberships("alice") == {"infra": (False, False), "vision": (True, True)}
    assert team_changes("alice")[-1][1]["groups"] == ["vision-leads"]

    # No longer known to the directory: no access, and no team of its.
    assert not services.follow(identity, None, gone="no longer in the directory")
    assert memberships("alice") == {"infra": (False, False)}


def test_a_refused_login_takes_the_teams_the_groups_no_longer_give(proxy, alpha):
    through_proxy(Client(), "/", "alice", "gpu-operators, gpu-vision, gpu-nlp")
    response = through_proxy(Client(), "/", "alice", "gpu-nlp", follow=True)
    assert response.redirect_chain[-1][0] == reverse("sso:no-access")
    assert memberships("alice") == {"nlp": (False, True), "speech": (False, True)}


@pytest.mark.integration
@pytest.mark.django_db
def test_ldap_the_login_gives_the_teams_and_the_recheck_takes_one_away(ldap_site, directory, settings, alpha):
    # nina is in gpu-admins only through the nested group gpu-leads.
    settings.GPUFLEET_SSO_TEAM_GROUPS = parse_team_groups(f"vision=gpu-viewers; lead:vision=cn=gpu-admins,{GROUPS}")
    directory.add_member("gpu-viewers", "alice")
    client, _ = ldap_log_in("alice")
    ldap_log_in("nina")
    assert memberships("alice") == {"vision": (False, True)} and memberships("nina") == {"vision": (True, True)}
    assert team_changes("alice")[0][1]["groups"] == [f"cn=gpu-viewers,{GROUPS}"]

    directory.remove_member("gpu-viewers", "alice")
    with later():
        assert client.get(reverse("fleet:overview")).status_code == 200  # still an operator
    assert memberships("alice") == {}
    assert team_changes("alice")[-1][0] == {"teams": ["vision"], "leads": []}


@pytest.mark.integration
@pytest.mark.django_db
def test_oidc_the_login_gives_the_teams_and_the_recheck_takes_one_away(settings, openid_provider, alpha):
    for name, value in openid_provider.settings().items():
        setattr(settings, name, value)
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, "gpufleet.sso.oidc.OIDCBackend"]
    settings.GPUFLEET_SSO_TEAM_GROUPS = parse_team_groups("ml=gpu-operators; lead:ml=gpu-admins")
    client = Client()
    oidc_log_in(client, openid_provider, "olivia")
    oidc_log_in(Client(), openid_provider, "adele")
    assert memberships("olivia") == {"ml": (False, True)} and memberships("adele") == {"ml": (True, True)}

    openid_provider.set_groups("olivia", ["gpu-users"])
    with later():
        assert client.get("/claims/").status_code == 200  # a viewer now
    assert memberships("olivia") == {}
