"""The JSON API: nodes, devices, findings and claims; claims are writable.

Authentication is the site's session (anonymous requests get 401 JSON from the
login middleware) and writes keep Django's CSRF check: a script logs in through
/accounts/login/ like a browser, keeps its cookies, and sends the `csrftoken`
cookie's value back in an `X-CSRFToken` header (every API response sets that
cookie); over HTTPS it also sends a Referer of the site. Reads need the "view" permission, writes "edit_claims"
(gpufleet.core.access), otherwise 403 JSON.

Errors are `{"error": {"code": ..., "message": ...}}`. A refused claim carries the
ledger's machine code: 422 when the claim itself is wrong (unknown_device,
duplicate_device, invalid), 409 when it conflicts with the node's state or other
claims (no_gpu, runtime_missing, device_taken, insufficient, name_taken, stale)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import wraps

from django.contrib.auth.decorators import login_not_required
from django.core.paginator import EmptyPage, PageNotAnInteger, Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import get_token
from django.views.csrf import csrf_failure as django_csrf_failure

from gpufleet import gpu
from gpufleet.api import serializers
from gpufleet.claims import services
from gpufleet.claims.models import Claim
from gpufleet.core.access import EDIT_CLAIMS, VIEW, can
from gpufleet.fleet.models import Node

PAGE_SIZE = 100
_READS = ("GET", "HEAD")
_BODY_FIELDS = {"name", "count", "device_ids"}
# Refusals about the claim itself; everything else conflicts with the node's state.
_UNPROCESSABLE = {"unknown_device", "duplicate_device", "invalid"}


class BadRequest(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def error(status: int, code: str, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, **extra}}, status=status)


def endpoint(*methods: str):
    """Allow `methods`; reads need VIEW, writes EDIT_CLAIMS; answer every refusal in JSON."""
    allowed = set(methods) | ({"HEAD"} if "GET" in methods else set())

    def decorator(view):
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in allowed:
                response = error(405, "method_not_allowed", f"{request.method} is not allowed here")
                response["Allow"] = ", ".join(sorted(allowed))
                return response
            if not request.user.is_authenticated:
                return error(401, "login_required", "log in first")
            action = VIEW if request.method in _READS else EDIT_CLAIMS
            if not can(request.user, action):
                return error(403, "forbidden", f"your role may not {action.replace('_', ' ')}")
            # Like @ensure_csrf_cookie: any API answer leaves the csrftoken cookie that
            # a script sends back as X-CSRFToken on its writes.
            get_token(request)
            try:
                return view(request, *args, **kwargs)
            except BadRequest as exc:
                extra = {"field": exc.field} if exc.field else {}
                return error(exc.status, exc.code, exc.message, **extra)

        # The API answers a missing login itself (401 JSON above), never with a redirect.
        return login_not_required(wrapper)

    return decorator


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: JSON for the API, Django's page for everything else."""
    if request.path.startswith("/api/"):
        return error(
            403,
            "csrf_failed",
            f"CSRF check failed ({reason}); send the csrftoken cookie's value in an X-CSRFToken header",
        )
    return django_csrf_failure(request, reason=reason)


# --- reads -----------------------------------------------------------------


@endpoint("GET")
def nodes(request: HttpRequest) -> HttpResponse:
    """Every node, paginated (?page=); two queries whatever the fleet size."""
    return _paginated(request, Node.objects.order_by("name"), serializers.node_summary)


@endpoint("GET")
def node(request: HttpRequest, name: str) -> HttpResponse:
    node = _node(name)
    devices = list(node.devices.order_by("index"))
    claims = list(node.claims.select_related("created_by"))
    ledger = _ledger(node, devices, claims)
    findings = list(node.findings.all())
    return JsonResponse(serializers.node_detail(node, devices, findings, claims, ledger))


@endpoint("GET")
def node_devices(request: HttpRequest, name: str) -> HttpResponse:
    """The node's GPUs, vanished ones included (with vanished_at), and who holds each."""
    node = _node(name)
    devices = list(node.devices.order_by("index"))
    ledger = _ledger(node, devices, list(node.claims.all()))
    return JsonResponse({"node": node.name, "results": [serializers.device(d, ledger) for d in devices]})


@endpoint("GET")
def node_findings(request: HttpRequest, name: str) -> HttpResponse:
    node = _node(name)
    return JsonResponse({"node": node.name, "results": [serializers.finding(f) for f in node.findings.all()]})


@endpoint("GET")
def claims(request: HttpRequest) -> HttpResponse:
    """Every claim of the fleet (?node= for one node), paginated."""
    rows = Claim.objects.select_related("node", "created_by").order_by("node__name", "name")
    if request.GET.get("node"):
        rows = rows.filter(node__name=request.GET["node"])
    return _paginated(request, rows, serializers.claim)


# --- claims, writable ------------------------------------------------------


@endpoint("GET", "POST")
def node_claims(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the node's claims and ledger. POST {name, count?, device_ids?}: add a claim
    (no device ids and no count, or count 0, means every GPU)."""
    node = _node(name)
    if request.method in _READS:
        rows = list(node.claims.select_related("created_by"))
        ledger = _ledger(node, list(node.devices.filter(vanished_at__isnull=True)), rows)
        return JsonResponse(
            {
                "node": node.name,
                "ledger": serializers.ledger_summary(ledger),
                "results": [serializers.claim(c) for c in rows],
            }
        )
    proposed, _ = _claim_from_body(request, allow_version=False)
    try:
        saved = services.save_claim(node, proposed, request.user)
    except services.ClaimError as exc:
        return _refused(exc)
    return JsonResponse(serializers.claim(_reload(saved)), status=201)


@endpoint("GET", "PUT", "DELETE")
def claim(request: HttpRequest, pk: int) -> HttpResponse:
    """GET one claim; PUT replaces it (same body as POST, plus an optional updated_at
    that must match, or 409 stale); DELETE removes it (optional ?updated_at=)."""
    try:
        row = Claim.objects.select_related("node", "created_by").get(pk=pk)
    except Claim.DoesNotExist:
        return error(404, "not_found", f"there is no claim {pk}")
    if request.method in _READS:
        return JsonResponse(serializers.claim(row))
    try:
        if request.method == "PUT":
            proposed, version = _claim_from_body(request, allow_version=True)
            saved = services.save_claim(row.node, proposed, request.user, editing=row, expected_updated_at=version)
            return JsonResponse(serializers.claim(_reload(saved)))
        version = _version(request.GET.get("updated_at"))
        services.delete_claim(row, request.user, expected_updated_at=version)
    except services.ClaimError as exc:
        return _refused(exc)
    return HttpResponse(status=204)


# --- helpers ---------------------------------------------------------------


def _node(name: str) -> Node:
    try:
        return Node.objects.get(name=name)
    except Node.DoesNotExist:
        raise BadRequest(404, "not_found", f"there is no node {name!r}") from None


def _ledger(node: Node, devices, claims) -> gpu.Ledger:
    return node.ledger(devices=[d for d in devices if not d.vanished], claims=claims)


def _reload(saved: Claim) -> Claim:
    return Claim.objects.select_related("node", "created_by").get(pk=saved.pk)


def _refused(exc: services.ClaimError) -> JsonResponse:
    if isinstance(exc, services.ClaimGone):
        return error(404, exc.code, exc.message)
    return error(422 if exc.code in _UNPROCESSABLE else 409, exc.code, exc.message)


def _paginated(request: HttpRequest, rows, serialize) -> JsonResponse:
    paginator = Paginator(rows, PAGE_SIZE)
    try:
        page = paginator.page(request.GET.get("page") or 1)
    except PageNotAnInteger:
        raise BadRequest(400, "bad_page", "page must be a whole number") from None
    except EmptyPage:
        raise BadRequest(404, "bad_page", f"there is no page {request.GET.get('page')}") from None

    def link(number: int) -> str:
        query = request.GET.copy()
        query["page"] = str(number)
        return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

    return JsonResponse(
        {
            "count": paginator.count,
            "page": page.number,
            "pages": paginator.num_pages,
            "next": link(page.next_page_number()) if page.has_next() else None,
            "previous": link(page.previous_page_number()) if page.has_previous() else None,
            "results": [serialize(row) for row in page.object_list],
        }
    )


def _claim_from_body(request: HttpRequest, allow_version: bool) -> tuple[gpu.Claim, datetime | None]:
    try:
        body = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, "bad_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "bad_json", "the request body must be a JSON object")
    known = _BODY_FIELDS | ({"updated_at"} if allow_version else set())
    unknown = sorted(set(body) - known)
    if unknown:
        # A misspelt "device_ids" must not silently become a claim on every GPU.
        raise BadRequest(
            422,
            "invalid",
            f"unknown field(s): {', '.join(unknown)}; expected {', '.join(sorted(known))}",
            field=unknown[0],
        )
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest(422, "invalid", "name must be a non-empty string", field="name")
    name = name.strip()
    if len(name) > Claim._meta.get_field("name").max_length:
        raise BadRequest(422, "invalid", "name must be at most 100 characters", field="name")
    count = body.get("count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise BadRequest(422, "invalid", "count must be a whole number, 0 or more (0 means every GPU)", field="count")
    device_ids = body.get("device_ids", [])
    if not isinstance(device_ids, list) or any(
        isinstance(d, bool) or not isinstance(d, (str, int)) for d in device_ids
    ):
        raise BadRequest(422, "invalid", "device_ids must be a list of GPU indexes or UUIDs", field="device_ids")
    if device_ids and count:
        raise BadRequest(422, "invalid", "give either count or device_ids, not both", field="count")
    version = _version(body.get("updated_at")) if allow_version else None
    return gpu.Claim(name=name, count=count, device_ids=tuple(str(d) for d in device_ids)), version


def _version(raw) -> datetime | None:
    if raw in (None, ""):
        return None
    if not isinstance(raw, str):
        raise BadRequest(422, "invalid", "updated_at must be an ISO 8601 time", field="updated_at")
    try:
        return datetime.fromisoformat(raw)
    except ValueError:
        raise BadRequest(422, "invalid", "updated_at must be an ISO 8601 time", field="updated_at") from None
