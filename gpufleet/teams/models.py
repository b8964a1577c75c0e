"""Teams: the people who book GPUs together and answer for their claims."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models.functions import Lower

from gpufleet.core.access import MANAGE_USERS, can
from gpufleet.gpu.quota import Quota


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
    # Quotas (gpufleet/gpu/quota.py; empty: no limit), checked as claims are saved.
    max_gpus = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="most GPUs at once", help_text="The most GPUs the team may hold at any instant."
    )
    max_gpus_by_model = models.JSONField(
        default=dict, blank=True, verbose_name="most GPUs at once by model",
        help_text='As {"H100": 8}: a model as find-a-node takes it (part of the GPU\'s name, any case) and the most of'
                  " its GPUs the team may hold at any instant.",
    )
    gpu_hours_per_month = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="GPU-hours per month",
        help_text="The GPU-hours the team may reserve in a calendar month, bookings ahead included.",
    )
    max_gpu_hours_ahead = models.PositiveIntegerField(
        null=True, blank=True, verbose_name="GPU-hours ahead",
        help_text="The GPU-hours the team may hold booked beyond the next 24 hours.",
    )

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(Lower("name"), name="team_unique_name_any_case")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.max_gpus_by_model is None:  # the admin's field left empty
            self.max_gpus_by_model = {}
        by_model = self.max_gpus_by_model
        if not isinstance(by_model, dict) or not all(
            isinstance(model, str) and model.strip() and type(n) is int and n >= 0 for model, n in by_model.items()
        ):
            raise ValidationError({"max_gpus_by_model": 'Give each model its most GPUs, as {"H100": 8}.'})

    def quota(self) -> Quota:
        return Quota(
            max_gpus=self.max_gpus,
            max_gpus_by_model=dict(self.max_gpus_by_model or {}),
            gpu_hours_per_month=self.gpu_hours_per_month,
            max_gpu_hours_ahead=self.max_gpu_hours_ahead,
        )


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
