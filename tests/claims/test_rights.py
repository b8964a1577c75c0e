"""Who may book for a team and change or release its claims (gpufleet/claims/rights.py), as
a matrix of persona by action at the services, then a few of the same through the pages and
the API. Team "vision" has a lead, an operator, members and a member `bob` whose claim is
"another member's"; team "audio" is a team none of the personas but the admin touches."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Group

from gpufleet import gpu
from gpufleet.audit.models import AuditEntry
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.teams.models import Team
from tests.claims.helpers import HTMX, field_errors, make_node, post_claim

pytestmark = pytest.mark.django_db

# persona: (role, team "vision" membership: None, "member" or "lead", other teams)
PERSONAS = {
    "admin": ("admin", None, ()),
    "lead": ("viewer", "lead", ()),
    "operator_member": ("operator", "member", ()),
    "operator_non_member": ("operator", None, ("nlp",)),
    "viewer_member": ("viewer", "member", ()),
    "member_without_role": (None, "member", ()),
    "no_team": ("operator", None, ()),
    "viewer_non_member": ("viewer", None, ()),
}
ACTIONS = ["book", "change_own", "change_other", "release_own", "release_other", "change_other_team", "set_owner"]
ALLOWED = {
    "admin": set(ACTIONS),
    "lead": set(ACTIONS) - {"change_other_team"},
    "operator_member": set(ACTIONS) - {"change_other_team"},
    "operator_non_member": set(),
    "viewer_member": {"book", "change_own", "release_own"},
    "member_without_role": set(),  # no role: reads nothing, so books nothing
    "no_team": set(),
    "viewer_non_member": set(),
}


def _user(django_user_model, username: str, role: str | None):
    user = django_user_model.objects.create_user(username=username, password="pw")
    if role:
        user.groups.add(Group.objects.get(name=role))
    return user


def _saved_by_system(node, name: str, team: Team, owner) -> Claim:
    return services.save_claim(node, gpu.Claim(name, count=1), None, terms=services.Terms(owner=owner, team=team))


@pytest.fixture
def world(django_user_model):
    node = make_node("alpha", 8)
    vision, audio = Team.objects.create(name="vision"), Team.objects.create(name="audio")
    nlp = Team.objects.create(name="nlp")
    bob = _user(django_user_model, "bob", "viewer")
    vision.memberships.create(user=bob)
    people = {}
    for persona, (role, membership, others) in PERSONAS.items():
        person = people[persona] = _user(django_user_model, persona.replace("_", "-"), role)
        if membership:
            vision.memberships.create(user=person, lead=membership == "lead")
        for name in others:
            {"nlp": nlp}[name].memberships.create(user=person)
    return {"node": node, "vision": vision, "audio": audio, "bob": bob, "people": people}


def _act(world, persona: str, action: str):
    node, vision, user = world["node"], world["vision"], world["people"][persona]
    if action == "book":
        return services.save_claim(node, gpu.Claim("new", count=1), user, terms=services.Terms(owner=user, team=vision))
    if action == "set_owner":
        return services.save_claim(node, gpu.Claim("new", count=1), user,
                                   terms=services.Terms(owner=world["bob"], team=vision))
    owner = user if action.endswith("own") else world["bob"]
    team = world["audio"] if action == "change_other_team" else vision
    target = _saved_by_system(node, "target", team, owner)
    if action.startswith("release"):
        return services.delete_claim(target, user, expected_updated_at=target.updated_at)
    return services.save_claim(node, gpu.Claim("target", count=2), user, editing=target,
                               expected_updated_at=target.updated_at, terms=services.Terms(owner=owner, team=team))


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("persona", list(PERSONAS))
def test_the_services_allow_exactly_the_matrix(world, persona, action):
    user = world["people"][persona]
    if action in ALLOWED[persona]:
        _act(world, persona, action)
        entry = AuditEntry.objects.filter(user=user).get()
        assert entry.action == {"book": "claim.create", "set_owner": "claim.create"}.get(
            action, "claim.delete" if action.startswith("release") else "claim.update")
        assert (entry.after or entry.before)["team"] == ("audio" if action == "change_other_team" else "vision")
    else:
        with pytest.raises(services.NotAllowed) as refused:
            _act(world, persona, action)
        assert refused.value.code == "forbidden"
        assert not AuditEntry.objects.filter(user=user).exists()
        assert not Claim.objects.filter(name="new").exists()
        if action not in ("book", "set_owner"):
            assert Claim.objects.get(name="target").count == 1


def test_an_edit_is_audited_with_who_and_the_team_before_and_after(world):
    lead, node = world["people"]["lead"], world["node"]
    target = _saved_by_system(node, "target", world["vision"], world["bob"])
    services.save_claim(node, gpu.Claim("target", count=3), lead, editing=target,
                        expected_updated_at=target.updated_at, terms=services.Terms(owner=world["bob"]))
    entry = AuditEntry.objects.get(action="claim.update")
    assert entry.user == lead
    assert (entry.before["team"], entry.before["count"], entry.after["team"], entry.after["count"]) == ("vision", 1, "vision", 3)


def test_an_owner_must_be_a_member_of_the_team(world):
    outsider = world["people"]["viewer_non_member"]
    with pytest.raises(services.BadTerms) as refused:
        services.save_claim(world["node"], gpu.Claim("new", count=1), world["people"]["lead"],
                            terms=services.Terms(owner=outsider, team=world["vision"]))
    assert (refused.value.field, refused.value.message) == ("owner", "Viewer-non-member is not a member of team vision.")


def test_moving_a_claim_to_another_team_needs_rights_on_both(world, django_user_model):
    node, vision, nlp = world["node"], world["vision"], Team.objects.get(name="nlp")
    both = _user(django_user_model, "both", "viewer")
    vision.memberships.create(user=both)
    mine = _saved_by_system(node, "mine", vision, both)

    def move(user, claim):
        return services.save_claim(node, gpu.Claim(claim.name, count=1), user, editing=claim,
                                   expected_updated_at=claim.updated_at, terms=services.Terms(owner=claim.owner, team=nlp))

    with pytest.raises(services.NotAllowed, match="not one of its members"):
        move(both, mine)  # theirs to change, but not a team of theirs to book for
    nlp.memberships.create(user=both)
    assert move(both, mine).team == nlp
    # The lead of vision may change bob's claim there, but not book for nlp.
    bobs = _saved_by_system(node, "bobs", vision, world["bob"])
    with pytest.raises(services.NotAllowed):
        move(world["people"]["lead"], bobs)
    assert Claim.objects.get(pk=bobs.pk).team == vision


def test_a_claim_of_no_team_is_the_admins_alone(world):
    node = world["node"]
    legacy = services.save_claim(node, gpu.Claim("legacy", count=1), None)
    assert legacy.team is None
    with pytest.raises(services.NotAllowed):
        services.delete_claim(legacy, world["people"]["operator_member"], expected_updated_at=legacy.updated_at)
    services.delete_claim(legacy, world["people"]["admin"], expected_updated_at=legacy.updated_at)
    assert not Claim.objects.filter(name="legacy").exists()


def test_a_person_in_several_teams_says_which_and_in_one_gets_theirs(world):
    node, member = world["node"], world["people"]["viewer_member"]
    assert services.save_claim(node, gpu.Claim("one", count=1), member).team == world["vision"]
    world["audio"].memberships.create(user=member)
    with pytest.raises(services.BadTerms) as refused:
        services.save_claim(node, gpu.Claim("two", count=1), member)
    assert refused.value.field == "team"
    assert refused.value.message == "Say which team the claim is for: audio, vision."


# --- through the pages ------------------------------------------------------------------


def _client(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_the_pages_show_edit_and_delete_only_on_claims_the_person_may_change(world):
    member = world["people"]["viewer_member"]
    mine = _saved_by_system(world["node"], "mine", world["vision"], member)
    bobs = _saved_by_system(world["node"], "bobs", world["vision"], world["bob"])
    for url in ["/claims/", "/nodes/alpha/"]:
        html = _client(member).get(url).content.decode()
        assert f'href="/claims/{mine.pk}/edit/"' in html and f'href="/claims/{bobs.pk}/edit/"' not in html, url
        html = _client(world["people"]["operator_member"]).get(url).content.decode()
        assert f'href="/claims/{mine.pk}/edit/"' in html and f'href="/claims/{bobs.pk}/edit/"' in html, url
        html = _client(world["people"]["operator_non_member"]).get(url).content.decode()
        assert "/edit/" not in html, url


@pytest.mark.parametrize("htmx", [False, True])
def test_the_pages_refuse_another_members_claim_to_a_member_and_save_their_own(world, htmx):
    member = world["people"]["viewer_member"]
    client = _client(member)
    mine = _saved_by_system(world["node"], "mine", world["vision"], member)
    bobs = _saved_by_system(world["node"], "bobs", world["vision"], world["bob"])
    extra = HTMX if htmx else {}
    assert client.get(f"/claims/{bobs.pk}/edit/", **extra).status_code == 403
    body = {"name": "bobs", "mode": "count", "count": "2", "updated_at": bobs.updated_at.isoformat(), "confirm": "yes"}
    for url in [f"/claims/{bobs.pk}/edit/", f"/claims/{bobs.pk}/validate/", f"/claims/{bobs.pk}/delete/"]:
        assert client.post(url, body, **extra).status_code == 403, url
    body = {"name": "mine", "mode": "count", "count": "2", "owner": member.username, "updated_at": mine.updated_at.isoformat()}
    response = client.post(f"/claims/{mine.pk}/edit/", body)
    assert response.status_code == 302
    assert Claim.objects.get(pk=mine.pk).count == 2 and Claim.objects.get(pk=bobs.pk).count == 1


def test_the_add_form_refuses_people_in_no_team_and_offers_a_choice_to_people_in_several(world):
    assert _client(world["people"]["no_team"]).get("/claims/nodes/alpha/new/").status_code == 403
    member = world["people"]["viewer_member"]
    html = _client(member).get("/claims/nodes/alpha/new/").content.decode()
    assert 'type="hidden" name="team" value="vision"' in html and "Team: <strong>vision</strong>" in html
    world["audio"].memberships.create(user=member)
    html = _client(member).get("/claims/nodes/alpha/new/").content.decode()
    assert '<select name="team"' in html
    assert '<option value="audio"' in html and '<option value="vision"' in html and '<option value="nlp"' not in html
    response = _client(member).post("/claims/nodes/alpha/new/", {"name": "x", "mode": "count", "count": "1", "team": "audio",
                                                                 "owner": member.username})
    assert response.status_code == 302
    assert Claim.objects.get(name="x").team == world["audio"]


def test_a_member_giving_a_claim_to_someone_else_is_told_why_at_the_top_of_the_form(world):
    member = world["people"]["viewer_member"]
    response = _client(member).post("/claims/nodes/alpha/new/", {"name": "x", "mode": "count", "count": "1", "owner": "bob"})
    assert response.status_code == 200
    assert field_errors(response.content.decode(), "form") == [
        "Only team vision's leads and operators, and admins, may give a claim to someone else."]
    assert not Claim.objects.filter(name="x").exists()


# --- through the API ------------------------------------------------------------------


def _put(client, claim: Claim, **changes):
    body = {"name": claim.name, "count": 2, "updated_at": claim.updated_at.isoformat(), **changes}
    return client.put(f"/api/claims/{claim.pk}/", json.dumps(body), content_type="application/json")


def test_the_api_answers_the_rights_with_their_statuses(world):
    member, lead = world["people"]["viewer_member"], world["people"]["lead"]
    mine = _saved_by_system(world["node"], "mine", world["vision"], member)
    bobs = _saved_by_system(world["node"], "bobs", world["vision"], world["bob"])
    refused = _put(_client(member), bobs)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    assert "bobs of team vision" in refused.json()["error"]["message"]
    assert _put(_client(lead), bobs).json()["count"] == 2
    assert _put(_client(member), mine).json()["team"] == "vision"
    version = urlencode({"updated_at": Claim.objects.get(pk=mine.pk).updated_at.isoformat()})
    response = _client(member).delete(f"/api/claims/{mine.pk}/?{version}")
    assert response.status_code == 204
    # Booking for a team one is not in, and writing from no team at all.
    assert post_claim(_client(member), {"name": "a", "count": 1, "team": "audio"}).status_code == 403
    assert post_claim(_client(world["people"]["no_team"]), {"name": "a", "count": 1}).status_code == 403
    assert post_claim(_client(member), {"name": "a", "count": 1, "team": "ghost"}).json()["error"]["field"] == "team"
    created = post_claim(_client(world["people"]["admin"]), {"name": "a", "count": 1, "team": "audio"})
    assert (created.status_code, created.json()["team"]) == (201, "audio")


def test_the_api_asks_a_person_in_several_teams_which_one(world):
    member = world["people"]["viewer_member"]
    world["audio"].memberships.create(user=member)
    response = post_claim(_client(member), {"name": "a", "count": 1})
    assert response.status_code == 422
    assert response.json()["error"] == {"code": "invalid", "field": "team",
                                        "message": "Say which team the claim is for: audio, vision."}
    assert post_claim(_client(member), {"name": "a", "count": 1, "team": "Vision"}).json()["team"] == "vision"


def test_a_refusal_names_the_claim_in_the_way_with_its_team(operator):
    node = make_node("alpha", 2)
    vision = Team.objects.create(name="vision")
    services.save_claim(node, gpu.Claim("train-llm", device_ids=(node.devices.get(index=1).uuid,)), None,
                        terms=services.Terms(team=vision))
    with pytest.raises(services.ClaimRejected) as refused:
        services.save_claim(node, gpu.Claim("eval", device_ids=("1",)), operator)
    assert "is already reserved by train-llm (team vision)" in refused.value.message
    with pytest.raises(services.ClaimRejected) as refused:
        services.save_claim(node, gpu.Claim("all", count=0), operator)
    assert "train-llm (team vision)" in refused.value.message
