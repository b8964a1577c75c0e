"""A node's maintenance in the API, as its node page has it: read by every role, set
(PUT `{until, reason, validate}`) and ended (DELETE) by the operator and admin roles, with a
read-write token or the session (docs/maintenance.md). `validate` is the form's "afterwards:
in validation" choice; the admin role ends a validation without a run (DELETE
.../maintenance/validation/), as the page's button does (docs/diagnostics.md)."""

# No `from __future__ import annotations`, as in gpufleet/api/alerts.py.
from datetime import datetime

from django.http import HttpRequest, HttpResponse
from ninja import Field, Router, Schema
from pydantic import ConfigDict

from gpufleet.api.errors import ApiError, errors
from gpufleet.api.schemas import Out, Time
from gpufleet.core.access import MAINTAIN, RUN_DCGM_DIAG, can
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Node
from gpufleet.gpu import dcgm

router = Router()

SENT = {"exclude_unset": True}
ONE = errors(401, 403, 404)
WRITE = errors(400, 401, 403, 404, 415, 422)
PATH = "/nodes/{node:name}/maintenance/"
VALIDATION_PATH = PATH + "validation/"
LEVELS = " or ".join(map(str, dcgm.LEVELS))


class MaintenanceIn(Schema):
    # A misspelt "validate" must not silently put the node back in service afterwards.
    model_config = ConfigDict(extra="forbid")

    until: datetime
    reason: str
    # Named as the page's form names it; `validate` itself would shadow pydantic's method.
    validate_level: int | None = Field(
        None, alias="validate",
        description=f"afterwards in validation until a DCGM diagnostic of this level ({LEVELS}) passes; left out "
                    "or null: back in service (a validation the node is already in stays)",
    )


class ValidationOut(Out):
    level: int = Field(description="the least DCGM diagnostic level whose passing run ends it")
    since: Time
    reason: str
    author: str


class MaintenanceOut(Out):
    node: str
    in_maintenance: bool
    until: Time
    reason: str
    author: str
    started_at: Time
    in_validation: bool = Field(description="it takes no new claim until a DCGM diagnostic passes, even once "
                                            "its maintenance is over")
    validation: ValidationOut | None = Field(description="null when it is in none")


def _node(name: str) -> Node:
    try:
        return Node.objects.get(name=name)
    except Node.DoesNotExist:
        raise ApiError(404, "not_found", f"there is no node {name!r}") from None


def _may_maintain(request: HttpRequest) -> None:
    if not can(request.user, MAINTAIN):
        raise ApiError(403, "forbidden", "your role may not put nodes in maintenance")


def _author(user) -> str:
    return user.get_username() if user else ""


def _state(node: Node) -> dict:
    row = maintenance.current(node)
    if row is None:
        state = {"node": node.name, "in_maintenance": False, "until": None, "reason": "", "author": "",
                 "started_at": None}
    else:
        state = {
            "node": node.name,
            "in_maintenance": True,
            "until": row.until.isoformat(),
            "reason": row.reason,
            "author": _author(row.author),
            "started_at": row.started_at.isoformat(),
        }
    checked = maintenance.current_validation(node)
    state["in_validation"] = checked is not None
    state["validation"] = None if checked is None else {
        "level": checked.level,
        "since": checked.since.isoformat(),
        "reason": checked.reason,
        "author": _author(checked.author),
    }
    return state


@router.api_operation(["GET", "HEAD"], PATH, url_name="node_maintenance", response={200: MaintenanceOut, **ONE},
                      **SENT)
def maintenance_state(request: HttpRequest, name: str) -> dict:
    """Whether the node is in maintenance now, until when and why, and whether it is in validation."""
    return _state(_node(name))


@router.put(PATH, url_name="node_maintenance", response={200: MaintenanceOut, **WRITE}, **SENT)
def maintenance_set(request: HttpRequest, name: str, body: MaintenanceIn) -> dict:
    """Put the node in maintenance until `until` for `reason`, or change the one it is in;
    with `validate`, in validation afterwards."""
    _may_maintain(request)
    node = _node(name)
    try:
        maintenance.start(node, body.until, body.reason, request.user, validate_level=body.validate_level)
    except maintenance.MaintenanceNotYours as exc:
        raise ApiError(403, "forbidden", str(exc)) from None
    except maintenance.MaintenanceError as exc:
        raise ApiError(422, "invalid", str(exc)) from None
    return _state(node)


@router.delete(PATH, url_name="node_maintenance", response={204: None, **errors(401, 403, 404, 409)})
def maintenance_end(request: HttpRequest, name: str) -> HttpResponse:
    """End the node's maintenance now; 409 when it is in none."""
    _may_maintain(request)
    node = _node(name)
    try:
        maintenance.end(node, request.user)
    except maintenance.MaintenanceError as exc:
        raise ApiError(409, "not_in_maintenance", str(exc)) from None
    return HttpResponse(status=204)


@router.delete(VALIDATION_PATH, url_name="node_validation", response={204: None, **errors(401, 403, 404, 409)})
def validation_end(request: HttpRequest, name: str) -> HttpResponse:
    """End the node's validation without a passing run (admin role, as the node page's
    button); 409 when it is in none."""
    # The page's end_validation view asks the same: who may run a diagnostic may waive it.
    if not can(request.user, RUN_DCGM_DIAG):
        raise ApiError(403, "forbidden", "your role may not end a node's validation without a run")
    node = _node(name)
    try:
        maintenance.end_validation(node, request.user)
    except maintenance.MaintenanceError as exc:
        raise ApiError(409, "not_in_validation", str(exc)) from None
    return HttpResponse(status=204)
