"""The teams a person is in (every team for admins). One team's page, with its claims and
quotas, is the claims app's (gpufleet/claims/team_page.py), which may read claims."""

from __future__ import annotations

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from gpufleet.core.access import VIEW, requires
from gpufleet.teams.models import Team


@require_GET
@requires(VIEW)
def team_list(request: HttpRequest) -> HttpResponse:
    teams = Team.objects.visible_to(request.user).annotate(member_count=Count("memberships", distinct=True))
    return render(request, "teams/team_list.html", {"teams": teams})
