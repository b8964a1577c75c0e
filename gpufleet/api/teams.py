"""Teams in the API: a person reads the teams they are in, admins read every team and
make, change and delete them (with a read-write token or the session), each change
audited as in the admin site (gpufleet/teams/services.py)."""

# No `from __future__ import annotations`: ninja reads the paginated views' parameters
# through @paginate's wrapper, whose module cannot resolve names written as strings.
from typing import Annotated

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import ProtectedError, QuerySet
from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema, Status
from ninja.pagination import paginate
from pydantic import ConfigDict, StrictInt, StringConstraints

from gpufleet.api.errors import ApiError, errors
from gpufleet.api.pagination import Pages
from gpufleet.api.schemas import Out
from gpufleet.teams import services
from gpufleet.teams.models import Team, administers_teams

router = Router()

SENT = {"exclude_unset": True}
ONE = errors(401, 403, 404)

TeamName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                            max_length=Team._meta.get_field("name").max_length)]


class Quotas(Schema):
    """A team's quotas (docs/teams.md#quotas), null: no limit. The model checks the values
    (Team.clean_fields and Team.clean), so the API and the admin site refuse the same."""

    max_gpus: StrictInt | None = Field(None, description="the most GPUs the team may hold at any instant")
    max_gpus_by_model: dict | None = Field(
        None, description='the same per GPU model, as {"H100": 8}; null or {}: no limit by model')
    gpu_hours_per_month: StrictInt | None = Field(None, description="GPU-hours it may reserve in a calendar month")
    max_gpu_hours_ahead: StrictInt | None = Field(None, description="GPU-hours it may hold beyond the next 24 hours")


class TeamIn(Quotas):
    """A new team; `members` and `leads` are user names (leads are members too)."""

    model_config = ConfigDict(extra="forbid")

    name: TeamName
    members: list[str] = Field(default_factory=list)
    leads: list[str] = Field(default_factory=list)


class TeamUpdate(Quotas):
    """A team's changes: what is left out stays (a quota sent as null: no limit). `members`
    replaces the members (those from the directory's groups stay); `leads` says which
    members lead."""

    model_config = ConfigDict(extra="forbid")

    name: TeamName | None = None
    members: list[str] | None = None
    leads: list[str] | None = None


class TeamOut(Out):
    """A team: its members and which of them lead (user names, sorted), and its quotas
    (null, or {} by model: no limit)."""

    name: str
    members: list[str]
    leads: list[str]
    max_gpus: int | None
    max_gpus_by_model: dict[str, int]
    gpu_hours_per_month: int | None
    max_gpu_hours_ahead: int | None


def team(row: Team) -> dict:
    """A team as answered; reads `row.memberships` as prefetched (`_rows`)."""
    people = sorted((m.user.get_username(), m.lead) for m in row.memberships.all())
    return {"name": row.name, "members": [name for name, _ in people], "leads": [name for name, lead in people if lead],
            **{field: getattr(row, field) for field in services.QUOTA_FIELDS}}


def _rows(request: HttpRequest) -> QuerySet[Team]:
    return Team.objects.visible_to(request.user).prefetch_related("memberships__user")


def _one(request: HttpRequest, name: str) -> Team:
    # No team's name holds a control character, and PostgreSQL refuses a NUL in text outright.
    found = None if any(ord(c) < 32 or ord(c) == 127 for c in name) else _rows(request).filter(name__iexact=name).first()
    if found is None:
        # The same answer for a team that is not there and one the caller may not read.
        raise ApiError(404, "not_found", f"there is no team {name!r} of yours")
    return found


def _admin(request: HttpRequest) -> None:
    if not administers_teams(request.user):
        raise ApiError(403, "forbidden", "only the admin role makes and changes teams")


def _free_name(name: str, editing: Team | None = None) -> str:
    taken = Team.objects.filter(name__iexact=name)
    if editing is not None:
        taken = taken.exclude(pk=editing.pk)
    if taken.exists():
        raise ApiError(422, "invalid", f"there is a team {name!r} already", field="name")
    return name


def _people(usernames: list[str] | None, field: str) -> list | None:
    if usernames is None:
        return None
    found = {user.get_username(): user for user in get_user_model().objects.filter(username__in=usernames, is_active=True)}
    missing = sorted(set(usernames) - set(found))
    if missing:
        raise ApiError(422, "invalid", f"there is no active user {', '.join(map(repr, missing))}", field=field)
    return list(found.values())


def _save(request: HttpRequest, row: Team | None, name: str, body: TeamIn | TeamUpdate) -> Team:
    """save_team with the quotas the body sent; the model's refusal is a 422 naming the field."""
    quotas = {field: getattr(body, field) for field in services.QUOTA_FIELDS if field in body.model_fields_set}
    try:
        return services.save_team(request.user, row, name, _people(body.members, "members"),
                                  _people(body.leads, "leads"), quotas)
    except ValidationError as exc:
        field, messages = next(iter(exc.message_dict.items()))
        raise ApiError(422, "invalid", f"{field}: {messages[0]}", field=field) from None


@router.api_operation(["GET", "HEAD"], "/teams/", url_name="teams", response={200: list[TeamOut], **errors(400, 401, 403)},
                      **SENT)
@paginate(Pages, serialize=team)
def team_list(request: HttpRequest) -> QuerySet[Team]:
    """The teams the caller is in (every team for admins), by name."""
    return _rows(request)


@router.post("/teams/", url_name="teams", response={201: TeamOut, **errors(400, 401, 403, 415, 422)}, **SENT)
def team_add(request: HttpRequest, body: TeamIn) -> Status:
    """Make a team (admin role), with its quotas if given."""
    _admin(request)
    made = _save(request, None, _free_name(body.name), body)
    return Status(201, team(_one(request, made.name)))


@router.api_operation(["GET", "HEAD"], "/teams/{name}/", url_name="team", response={200: TeamOut, **ONE}, **SENT)
def team_one(request: HttpRequest, name: str) -> dict:
    """One team of the caller's (any team for admins)."""
    return team(_one(request, name))


@router.patch("/teams/{name}/", url_name="team", response={200: TeamOut, **errors(400, 401, 403, 404, 415, 422)}, **SENT)
def team_change(request: HttpRequest, name: str, body: TeamUpdate) -> dict:
    """Rename a team or set its members, leads and quotas (admin role); what is left out stays."""
    _admin(request)
    row = _one(request, name)
    changed = _save(request, row, _free_name(body.name, row) if body.name else row.name, body)
    return team(_one(request, changed.name))


@router.delete("/teams/{name}/", url_name="team", response={204: None, **errors(401, 403, 404, 409)})
def team_delete(request: HttpRequest, name: str) -> HttpResponse:
    """Delete a team (admin role): 409 while claims belong to it."""
    _admin(request)
    row = _one(request, name)
    try:
        services.delete_team(request.user, row)
    except ProtectedError:
        raise ApiError(409, "in_use", f"claims belong to team {row.name}: move or release them first") from None
    return HttpResponse(status=204)
