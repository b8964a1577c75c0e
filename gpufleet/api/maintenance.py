"""A node's maintenance in the API, as its node page has it: read by every role, set
(PUT `{until, reason}`) and ended (DELETE) by the operator and admin roles, with a
read-write token or the session (docs/maintenance.md)."""

# No `from __future__ import annotations`, as in gpufleet/api/alerts.py.
from datetime import datetime

from django.http import HttpRequest, HttpResponse
from ninja import Router, Schema

from gpufleet.api.errors import ApiError, errors
from gpufleet.api.schemas import Out, Time
from gpufleet.core.access import MAINTAIN, can
from gpufleet.fleet import maintenance
from gpufleet.fleet.models import Node

router = Router()

SENT = {"exclude_unset": True}
ONE = errors(401, 403, 404)
WRITE = errors(400, 401, 403, 404, 415, 422)
PATH = "/nodes/{node:name}/maintenance/"


class MaintenanceIn(Schema):
    until: datetime
    reason: str


class MaintenanceOut(Out):
    node: str
    in_maintenance: bool
    until: Time
    reason: str
    author: str
    started_at: Time


def _node(name: str) -> Node:
    try:
        return Node.objects.get(name=name)
    except Node.DoesNotExist:
        raise ApiError(404, "not_found", f"there is no node {name!r}") from None


def _may_maintain(request: HttpRequest) -> None:
    if not can(request.user, MAINTAIN):
        raise ApiError(403, "forbidden", "your role may not put nodes in maintenance")


def _state(node: Node) -> dict:
    row = maintenance.current(node)
    if row is None:
        return {"node": node.name, "in_maintenance": False, "until": None, "reason": "", "author": "",
                "started_at": None}
    return {
        "node": node.name,
        "in_maintenance": True,
        "until": row.until.isoformat(),
        "reason": row.reason,
        "author": row.author.get_username() if row.author else "",
        "started_at": row.started_at.isoformat(),
    }


@router.api_operation(["GET", "HEAD"], PATH, url_name="node_maintenance", response={200: MaintenanceOut, **ONE},
                      **SENT)
def maintenance_state(request: HttpRequest, name: str) -> dict:
    """Whether the node is in maintenance now, until when and why."""
    return _state(_node(name))


@router.put(PATH, url_name="node_maintenance", response={200: MaintenanceOut, **WRITE}, **SENT)
def maintenance_set(request: HttpRequest, name: str, body: MaintenanceIn) -> dict:
    """Put the node in maintenance until `until` for `reason`, or change the one it is in."""
    _may_maintain(request)
    node = _node(name)
    try:
        maintenance.start(node, body.until, body.reason, request.user)
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
