"""Changing teams outside the admin site (the API): each change audited with the team's
members before and after, as the admin site does (gpufleet/teams/admin.py)."""

from __future__ import annotations

from django.db import transaction

from gpufleet.audit.models import record
from gpufleet.teams.models import Membership, Team

QUOTA_FIELDS = ["max_gpus", "max_gpus_by_model", "gpu_hours_per_month", "max_gpu_hours_ahead"]


def team_state(team: Team) -> dict:
    rows = team.memberships.select_related("user").order_by("user__username")
    return {
        "name": team.name,
        "members": [row.user.get_username() for row in rows],
        "leads": [row.user.get_username() for row in rows if row.lead],
        "quotas": {name: getattr(team, name) for name in QUOTA_FIELDS},
    }


def save_team(user, team: Team | None, name: str, members: list | None, leads: list | None,
              quotas: dict | None = None) -> Team:
    """Create (`team` None) or change a team: its name, the quotas given (QUOTA_FIELDS by
    name; None: no limit; left out: as they are) and, when given, its members (users) and
    which of them lead (None: as they are); leads are members too. Members from the
    directory's groups stay though not listed: their next login would bring them back.
    Quotas the model refuses raise ValidationError before anything is saved."""
    with transaction.atomic():
        before = team_state(team) if team is not None else None
        team = team or Team()
        team.name = name
        for field, value in (quotas or {}).items():
            setattr(team, field, value)
        # The model's own checks of the quotas (the admin site's too); the name is the caller's.
        team.clean_fields(exclude=[f.name for f in Team._meta.fields if f.name not in QUOTA_FIELDS])
        team.clean()
        team.save()
        if members is not None or leads is not None:
            current = {row.user_id: row for row in team.memberships.all()}
            member_ids = {person.pk for person in members} if members is not None else set(current)
            lead_ids = ({person.pk for person in leads} if leads is not None
                        else {user_id for user_id, row in current.items() if row.lead})
            member_ids |= lead_ids
            gone = [row.pk for user_id, row in current.items() if user_id not in member_ids and not row.from_directory]
            Membership.objects.filter(pk__in=gone).delete()
            for user_id in member_ids:
                Membership.objects.update_or_create(team=team, user_id=user_id, defaults={"lead": user_id in lead_ids})
        record(user, "team.update" if before is not None else "team.create", target=team.name,
               before=before, after=team_state(team))
    return team


def delete_team(user, team: Team) -> None:
    """Delete a team; Django refuses (ProtectedError) while claims belong to it."""
    with transaction.atomic():
        record(user, "team.delete", target=team.name, before=team_state(team))
        team.delete()
