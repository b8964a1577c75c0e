"""One team's page: its members, leads, its claims now and booked ahead, and its quotas
with where it stands against them. Here rather than in the teams app, which sits below
claims and may not read them."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpufleet.claims.quota import team_quota_context
from gpufleet.core.access import VIEW, requires
from gpufleet.teams.models import Team

# The claims a team page lists in each of its tables; the claims page lists the rest.
CLAIMS_SHOWN = 200


@require_GET
@requires(VIEW)
def team_detail(request: HttpRequest, name: str) -> HttpResponse:
    team = Team.objects.visible_to(request.user).filter(name__iexact=name).first()
    if team is None:
        # The same answer for a team that is not there and one the person is not in.
        raise Http404("no such team of yours")
    now = timezone.now()
    claims = team.claims.select_related("node", "owner").order_by("starts_at", "node__name", "name")
    context = {
        "team": team,
        "memberships": team.memberships.select_related("user").order_by("user__username"),
        "claims_now": claims.in_force(now)[:CLAIMS_SHOWN],
        "claims_ahead": claims.booked(now)[:CLAIMS_SHOWN],
        "claims_shown": CLAIMS_SHOWN,
        **team_quota_context(team),
    }
    return render(request, "teams/team_detail.html", context)
