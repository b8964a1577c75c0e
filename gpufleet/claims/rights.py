"""Who may book GPUs for a team and change or release a claim: the one place that says
it. `gpufleet.core.access` says who may read; the services ask here before every save and
delete (under the node's lock), and the pages and the API ask here which controls to show.

- A member of a team books for it, and changes or releases the claims of it they own.
- A team's leads, and its members with the operator role, change every claim of it and
  may give its claims to another member (or to nobody).
- Admins (`gpufleet.teams.models.administers_teams`: the admin role, whose user
  management permission an active superuser has too) book for every team and change
  every claim, those of no team included.
- Anyone else reads, as their role allows. Nobody without a role (VIEW) books at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.core.access import EDIT_CLAIMS, VIEW, can
from gpufleet.teams.models import Membership, Team, administers_teams


@dataclass(frozen=True)
class Rights:
    """One person's rights over claims, read with one query of their memberships."""

    user_id: int | None = None
    admin: bool = False
    operator: bool = False
    teams: dict[int, bool] = field(default_factory=dict)  # team id -> lead

    def may_book(self, team_id: int | None) -> bool:
        return team_id is not None and (self.admin or team_id in self.teams)

    def may_book_somewhere(self) -> bool:
        return self.admin or bool(self.teams)

    def manages(self, team_id: int | None) -> bool:
        """Changes every claim of the team and gives them to any member."""
        if self.admin:
            return True
        return team_id in self.teams and (self.teams[team_id] or self.operator)

    def may_change(self, claim) -> bool:
        """Change or release `claim` (a Claim or anything with team_id and owner_id)."""
        if claim.team_id is None:
            return self.admin
        return self.manages(claim.team_id) or (claim.team_id in self.teams and claim.owner_id == self.user_id)


NOBODY = Rights()


def of(user) -> Rights:
    if not can(user, VIEW):
        return NOBODY
    teams = dict(Membership.objects.filter(user=user).order_by().values_list("team_id", "lead"))
    return Rights(user_id=user.pk, admin=administers_teams(user), operator=can(user, EDIT_CLAIMS), teams=teams)


def of_request(request) -> Rights:
    """`of(request.user)`, read once per request (a page asks for each claim it lists)."""
    if not hasattr(request, "claim_rights"):
        request.claim_rights = of(request.user)
    return request.claim_rights


def bookable_teams(rights: Rights):
    """The teams the person may book for, by name."""
    if rights.admin:
        return Team.objects.all()
    return Team.objects.filter(pk__in=list(rights.teams))


def default_team(rights: Rights) -> tuple[Team | None, list[str]]:
    """The team a person's claim is for when they name none: the one team they are in
    (an admin in none: the one team there is); else None and the teams to choose from."""
    if len(rights.teams) == 1:
        return Team.objects.get(pk=next(iter(rights.teams))), []
    choices = list(bookable_teams(rights).values_list("name", flat=True)[:CHOICES_SHOWN + 1])
    if rights.admin and not rights.teams and len(choices) == 1:
        return Team.objects.get(name=choices[0]), []
    return None, choices


# How many teams a "say which team" refusal names.
CHOICES_SHOWN = 20


def refusal(rights: Rights, user, editing, team: Team | None, owner) -> str | None:
    """Why the person may not save: `editing` (None: a new claim) for `team`, owned by
    `owner`; None when they may. Moving a claim to another team needs rights on both."""
    if not rights.may_book_somewhere():
        return "you are in no team, so you may read claims but not book or change them"
    if editing is not None and not rights.may_change(editing):
        return f"you may not change claim {editing.name}{_of(editing.team)}: {_WHO_CHANGES}"
    moved = editing is None or team is None or editing.team_id != team.pk
    if moved and team is not None and not rights.may_book(team.pk):
        return f"you may not book for team {team.name}: you are not one of its members"
    current = editing.owner_id if editing is not None else user.pk
    owner_id = owner.pk if owner is not None else None
    if (owner_id != current or moved) and owner_id != user.pk and not rights.manages(team.pk if team else None):
        return (f"only team {team.name}'s leads and operators, and admins, may give a claim to someone else"
                if team is not None else "only admins may give a claim of no team to someone else")
    return None


def release_refusal(rights: Rights, claim) -> str | None:
    """Why the person may not delete `claim`; None when they may."""
    if rights.may_change(claim):
        return None
    return f"you may not release claim {claim.name}{_of(claim.team)}: {_WHO_CHANGES}"


def is_member(team: Team, user) -> bool:
    return Membership.objects.filter(team=team, user=user).exists()


_WHO_CHANGES = "only its owner, its team's leads and operators, and admins may"


def _of(team: Team | None) -> str:
    return f" of team {team.name}" if team is not None else ", which is of no team"
