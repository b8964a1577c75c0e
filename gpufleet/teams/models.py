"""Teams: the people who book GPUs together and answer for their claims."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower

from gpufleet.core.access import MANAGE_USERS, can


def administers_teams(user) -> bool:
    """The admin role (through its user management permission, which an active superuser
    has too): makes and changes teams, reads every team, books for every team and changes
    every claim (gpufleet/claims/rights.py)."""
    return can(user, MANAGE_USERS)


class TeamQuerySet(models.QuerySet):
    def visible_to(self, user) -> TeamQuerySet:
        """The teams a person may read: their own; every team for admins."""
        if administers_teams(user):
            return self.all()
        if not (user and user.is_authenticated):
            return self.none()
        return self.filter(memberships__user=user)


class Team(models.Model):
    name = models.CharField(max_length=100)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(Lower("name"), name="team_unique_name_any_case")]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A person in a team. Rows from a directory's groups (GPUFLEET_SSO_TEAM_GROUPS) are
    replaced at each login and re-check; rows an admin added by hand are kept."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    lead = models.BooleanField(default=False, help_text="A lead changes every claim of the team.")
    from_directory = models.BooleanField(default=False, editable=False)

    class Meta:
        ordering = ["team", "user"]
        constraints = [models.UniqueConstraint("team", "user", name="membership_unique_person_per_team")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}" + (" (lead)" if self.lead else "")
