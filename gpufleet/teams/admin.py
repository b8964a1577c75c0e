"""Teams in the admin site: an admin makes local teams, adds people to them (members,
and the leads who change every claim of the team) and sets their quotas. Every add,
change and delete is audited with the team's members and quotas before and after."""

from __future__ import annotations

from django.contrib import admin

from gpufleet.audit.models import record
from gpufleet.teams.models import Membership, Team
from gpufleet.teams.services import QUOTA_FIELDS, team_state


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    fields = ["user", "lead", "from_directory"]
    readonly_fields = ["from_directory"]
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]
    fieldsets = [
        (None, {"fields": ["name"]}),
        ("Quotas", {"fields": QUOTA_FIELDS, "description": "Empty: no limit. A booking over one is refused unless "
                                                            "an admin books it saying why (docs/teams.md#quotas)."}),
    ]

    def get_object(self, request, object_id, from_field=None):
        team = super().get_object(request, object_id, from_field)
        if team is not None:
            request.team_before = (team.pk, team_state(team))
        return team

    def save_related(self, request, form, formsets, change):
        # Members are saved here, after the team itself: the state is complete only now.
        super().save_related(request, form, formsets, change)
        team = form.instance
        pk, before = getattr(request, "team_before", (None, None))
        action = "team.update" if change else "team.create"
        record(request.user, action, target=team.name, before=before if pk == team.pk else None, after=team_state(team))

    def delete_model(self, request, obj):
        record(request.user, "team.delete", target=obj.name, before=team_state(obj))
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        for team in queryset:
            record(request.user, "team.delete", target=team.name, before=team_state(team))
        super().delete_queryset(request, queryset)
