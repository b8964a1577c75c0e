"""The JSON API: nodes, devices, findings and claims; claims are writable. Its OpenAPI
schema is at /api/openapi.json and its docs page at /api/docs (Swagger UI from our own
static files); both need a login, like every endpoint.

Callers authenticate with a personal API token (`Authorization: Bearer <token>`, made on
the site's "API tokens" page) or the site's session; see gpufleet.api.auth for the rules.
Errors are `{"error": {"code": ..., "message": ...}}` (gpufleet.api.errors); a refused
claim carries the ledger's machine code."""

# No `from __future__ import annotations`: ninja reads the paginated views' parameters
# through @paginate's wrapper, whose module cannot resolve names written as strings.
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.http.request import RawPostDataException
from django.urls import reverse
from django.utils import timezone
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.defaults import bad_request as django_bad_request
from ninja import NinjaAPI, Query, Schema, Status, Swagger
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.pagination import paginate
from ninja.parser import Parser
from ninja.responses import Response

from gpufleet import gpu
from gpufleet.api import alerts, feeds, maintenance, serializers, teams, usage
from gpufleet.api.auth import Refused, SessionAuth, TokenAuth
from gpufleet.api.errors import ApiError, answer, error, errors, unsupported_media_type
from gpufleet.api.pagination import Pages
from gpufleet.api.schemas import (
    AvailabilityOut,
    ClaimIn,
    ClaimOut,
    ClaimUpdate,
    EventOut,
    NodeClaims,
    NodeDetail,
    NodeDevices,
    NodeFindings,
    NodeSummary,
    PlacementOut,
    SeriesOut,
    filter_query,
)
from gpufleet.claims import rights, services
from gpufleet.claims.availability import fleet_slots
from gpufleet.claims.filters import ClaimFilter
from gpufleet.claims.models import Claim
from gpufleet.claims.placement import RULED_OUT_SHOWN, fleet_placement
from gpufleet.events.filters import EventFilter, listed
from gpufleet.events.models import Event
from gpufleet.fleet.filters import NodeFilter
from gpufleet.fleet.models import Node
from gpufleet.gpu import availability as gpu_availability
from gpufleet.teams.models import Team

# The lists' query parameters are their pages' FilterSets; the node list's page size is
# the API's own (gpufleet.api.pagination), not the overview's `per`.
NodeQuery = filter_query(NodeFilter, exclude=("per",))
ClaimQuery = filter_query(ClaimFilter)
EventQuery = filter_query(EventFilter)


def _query(name: str, schema: dict) -> dict:
    return {"in": "query", "name": name, "required": False, "schema": schema}


# Read by the views themselves: a bad number is a 400 bad_parameter naming it.
PLACEMENT = [
    _query("count", {"type": "integer", "minimum": 0, "default": 1, "description": "GPUs wanted; 0: every GPU of one node"}),
    _query("model", {"type": "string", "description": "part of the GPU name, any case"}),
    _query("min_free_vram_mib", {"type": "integer", "minimum": 0, "default": 0, "description": "free VRAM per GPU"}),
]
AVAILABILITY = [
    _query("count", {"type": "integer", "minimum": 1, "default": 1, "description": "GPUs wanted, all on one node"}),
    _query("model", {"type": "string", "description": "part of the GPU name, any case"}),
    _query("min_free_vram_mib", {"type": "integer", "minimum": 0, "default": 0,
                                 "description": "memory per GPU: a booked GPU's whole memory is the booking's"}),
    _query("duration_hours", {"type": "number", "exclusiveMinimum": 0, "default": 1,
                              "description": "how long, at most GPUFLEET_MAX_RESERVATION_DAYS days"}),
    _query("after", {"type": "string", "format": "date-time",
                     "description": "the earliest start, ISO 8601 with a time zone; left out or past: now"}),
]
VERSION = {
    **_query(services.VERSION_FIELD, {"type": "string"}),
    "required": True,
    "description": "The claim's updated_at exactly as read (ISO 8601 with time zone); "
    "missing or unreadable: 428 version_required.",
}


class JsonParser(Parser):
    """Request bodies are JSON; one without a Content-Type is read as JSON too. Any other
    media type is refused by name (415), never misread as JSON. A NUL anywhere in the body
    is refused too, as in a page's query or form (gpufleet.core.middleware): PostgreSQL
    refuses it in text, and no field may hold one."""

    def parse_body(self, request: HttpRequest) -> dict:
        media = request.content_type or ""
        if media and media != "application/json" and not media.endswith("+json"):
            raise unsupported_media_type(media)
        data = super().parse_body(request)
        if _holds_nul(data):
            raise ApiError(400, "bad_request", "the request body holds a NUL character")
        return data


def _holds_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


class Api(NinjaAPI):
    def get_content_type(self) -> str:
        """JSON is UTF-8 (RFC 8259), so no charset: the header the API has always sent."""
        return self.renderer.media_type

    def get_openapi_schema(self, **kwargs):
        """HEAD is implied by every GET; listing it would repeat each read's operation id."""
        schema = super().get_openapi_schema(**kwargs)
        for operations in schema["paths"].values():
            operations.pop("head", None)
        return schema


api = Api(
    title="gpufleet API",
    version="1",
    description=__doc__,
    urls_namespace="api",
    auth=[TokenAuth(), SessionAuth()],
    parser=JsonParser(),
    # Served by the endpoints below, behind the same login as the rest of the API.
    openapi_url=None,
    # No call to an outside validator: fleets are often air-gapped.
    docs=Swagger(settings={"validatorUrl": None}),
)
# Channels, rules, silences and deliveries (gpufleet/api/alerts.py).
api.add_router("/", alerts.router)
# A node's maintenance (gpufleet/api/maintenance.py).
api.add_router("/", maintenance.router)
# GPU usage by owner, team, claim, image, label, node or model (gpufleet/api/usage.py).
api.add_router("/", usage.router)
# The URLs of a person's calendar feeds (gpufleet/api/feeds.py).
api.add_router("/", feeds.router)
# Teams: members read their own, admins write (gpufleet/api/teams.py).
api.add_router("/", teams.router)


# An answer holds the keys its serializer wrote: one it leaves out (a finding's `fix`
# when there is none) stays out rather than coming back as null.
SENT = {"exclude_unset": True}


def read(path: str, name: str, **options):
    """A read endpoint: GET, and HEAD as HTTP expects wherever GET is allowed."""
    return api.api_operation(["GET", "HEAD"], path, url_name=name, **SENT, **options)


# --- errors ------------------------------------------------------------------


@api.exception_handler(ApiError)
def _api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
    return answer(exc)


@api.exception_handler(Refused)
def _refused(request: HttpRequest, exc: Refused) -> HttpResponse:
    return exc.response


@api.exception_handler(AuthenticationError)
def _no_login(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return error(401, "login_required", "log in first, or send an API token as Authorization: Bearer <token>")


@api.exception_handler(HttpError)
def _unreadable_body(request: HttpRequest, exc: HttpError) -> HttpResponse:
    # Apart from auth, ninja raises HttpError itself only for a body it cannot parse (400),
    # wrapping what the parser raised: JsonParser's refusal keeps its own answer.
    if isinstance(exc.__cause__, ApiError):
        return answer(exc.__cause__)
    return error(exc.status_code, "bad_json", f"the request body is not valid JSON: {exc.__cause__ or exc}")


@api.exception_handler(RawPostDataException)
def _form_body(request: HttpRequest, exc: RawPostDataException) -> HttpResponse:
    # The session's CSRF check read a multipart body as a form, so it was never JSON.
    return answer(unsupported_media_type(request.content_type))


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    """The first problem found; `field` is the input at fault. A body that is missing or no
    object at all is unreadable (400), like one that is not JSON."""
    first = exc.errors[0]
    source, *path = first["loc"]
    if source == "body" and len(path) == 1:
        if first["type"] == "missing":
            return error(400, "bad_json", "the request body is not valid JSON: it is empty")
        return error(400, "bad_json", "the request body must be a JSON object")
    field = str(path[1] if source == "body" else path[0])
    if source == "query" and field == "page":
        return error(400, "bad_page", "page must be a whole number from 1", field)
    if source == "body" and field == services.VERSION_FIELD:
        # The same answer as for a version that is there but unreadable (see replace_claim).
        return answer(ApiError.from_claim_error(services.VersionRequired(missing=first["type"] == "missing")))
    return error(422, "invalid", f"{field}: {first['msg']}", field)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: JSON for the API, Django's page for everything else."""
    if request.path.startswith("/api/"):
        return error(
            403,
            "csrf_failed",
            f"CSRF check failed ({reason}); send the csrftoken cookie's value in an X-CSRFToken header, "
            "or use an API token",
        )
    return django_csrf_failure(request, reason=reason)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """handler400: JSON for the API, Django's page for everything else."""
    if request.path.startswith("/api/"):
        return error(400, "bad_request", str(exception) or "the request cannot be read")
    return django_bad_request(request, exception)


# --- schema and docs ---------------------------------------------------------


@read("/", "api-root", include_in_schema=False)
def root(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect(reverse("api:docs"))


@read("/openapi.json", "openapi-json", include_in_schema=False)
def openapi_json(request: HttpRequest) -> HttpResponse:
    return Response(api.get_openapi_schema())


@read("/docs", "docs", include_in_schema=False)
def docs(request: HttpRequest) -> HttpResponse:
    return api.docs.render_page(request, api)


# --- reads -------------------------------------------------------------------


# Every operation needs a login (401) and a role that may do it (403).
LIST = errors(400, 401, 403, 404)
ONE = errors(401, 403, 404)


@read("/nodes/", "nodes", response={200: list[NodeSummary], **LIST})
@paginate(Pages, serialize=serializers.node_summary)
def nodes(request: HttpRequest, filters: Query[NodeQuery]) -> QuerySet[Node]:
    """Every node, paginated (?page=); two queries whatever the fleet size."""
    return _node_rows(filters)


@read("/nodes/{node:name}/", "node", response={200: NodeDetail, **ONE})
def node(request: HttpRequest, name: str) -> dict:
    """One node with its devices, findings, claims and ledger."""
    node = _node(name)
    devices = list(node.devices.order_by("index"))
    claims = list(node.claims.select_related("created_by", "owner", "team"))
    ledger = _ledger(node, devices, claims)
    findings = list(node.findings.all())
    return serializers.node_detail(node, devices, findings, claims, ledger)


@read("/nodes/{node:name}/devices/", "node_devices", response={200: NodeDevices, **ONE})
def node_devices(request: HttpRequest, name: str) -> dict:
    """The node's GPUs, vanished ones included (with vanished_at), and who holds each."""
    node = _node(name)
    devices = list(node.devices.order_by("index"))
    ledger = _ledger(node, devices, list(node.claims.all()))
    return {"node": node.name, "results": [serializers.device(d, ledger) for d in devices]}


@read("/nodes/{node:name}/findings/", "node_findings", response={200: NodeFindings, **ONE})
def node_findings(request: HttpRequest, name: str) -> dict:
    """The node's doctor findings."""
    node = _node(name)
    return {"node": node.name, "results": [serializers.finding(f) for f in node.findings.all()]}


@read("/claims/", "claims", response={200: list[ClaimOut], **LIST})
@paginate(Pages, serialize=serializers.claim)
def claims(request: HttpRequest, filters: Query[ClaimQuery]) -> QuerySet[Claim]:
    """Every claim of the fleet (?node= for one node, ?owner= a username, ?state=booked|now|ended), paginated."""
    return _claim_rows(filters)


@read("/events/", "events", response={200: list[EventOut], **LIST})
@paginate(Pages, serialize=serializers.event)
def events(request: HttpRequest, filters: Query[EventQuery]) -> QuerySet[Event]:
    """The fleet's events as the Events page lists them (open first, then the newest), with
    its filters: ?kind=, ?severity=, ?node= (a name), ?gpu_model=, ?state=open|closed,
    ?since= and ?until= (ISO 8601: the events open at some moment between them)."""
    return _filtered(EventFilter(filters.model_dump(exclude_none=True), queryset=listed()))


@read("/placement", "placement", response={200: PlacementOut, **errors(400, 401, 403)}, openapi_extra={"parameters": PLACEMENT})
def placement(request: HttpRequest) -> dict:
    """Where a claim of `count` GPUs fits now: `fits` best first (fewest GPUs left over,
    then most free VRAM), and `ruled_out` with each other node's reason, counted by
    reason in `ruled_out_counts` and listed for the first RULED_OUT_SHOWN nodes."""
    wanted = gpu.PlacementRequest(
        count=_whole_number(request.GET, "count", 1),
        model=request.GET.get("model", "").strip(),
        min_free_vram_mib=_whole_number(request.GET, "min_free_vram_mib", 0),
    )
    answer = fleet_placement(wanted)
    return {
            "count": wanted.count,
            "model": wanted.model,
            "min_free_vram_mib": wanted.min_free_vram_mib,
            "fits": [
                {"node": f.name, "gpus": f.gpus, "left_over": f.left_over, "free_vram_mib": f.free_vram_mib}
                for f in answer.fits
            ],
            "ruled_out_counts": answer.ruled_out_counts(),
            "ruled_out": [
                {"node": r.name, "code": r.code, "reason": r.reason} for r in answer.ruled_out[:RULED_OUT_SHOWN]
            ],
        }


@read("/availability/", "availability", response={200: AvailabilityOut, **errors(400, 401, 403)},
      openapi_extra={"parameters": AVAILABILITY})
def availability(request: HttpRequest) -> dict:
    """The earliest windows `count` GPUs of one node are free for `duration_hours`, at
    `after` or later: each node's earliest, best first (earliest, then fewest GPUs left
    over), the first SLOTS_SHOWN. Nodes that take no new claims (offline, in maintenance
    or validation, failing, stale) are left out."""
    duration = _hours(request.GET, "duration_hours", 1)
    wanted = gpu_availability.SlotRequest(
        after=_moment(request.GET, "after") or timezone.now(),
        duration=timedelta(hours=duration),
        count=_whole_number(request.GET, "count", 1),
        model=request.GET.get("model", "").strip(),
        min_vram_mib=_whole_number(request.GET, "min_free_vram_mib", 0),
    )
    if wanted.count < 1:
        raise ApiError(400, "bad_parameter", "count must be a whole number from 1", field="count")
    now = timezone.now()
    return {
        "count": wanted.count,
        "model": wanted.model,
        "min_free_vram_mib": wanted.min_vram_mib,
        "duration_hours": duration,
        "after": max(wanted.after, now).astimezone(UTC).isoformat(),
        "windows": [
            {"node": slot.node, "gpus": [{"index": d.index, "uuid": d.uuid} for d in slot.gpus],
             "starts_at": slot.starts_at.astimezone(UTC).isoformat(), "ends_at": slot.ends_at.astimezone(UTC).isoformat()}
            for slot in fleet_slots(wanted, now)
        ],
    }


# --- claims, writable ----------------------------------------------------------


@read("/nodes/{node:name}/claims/", "node_claims", response={200: NodeClaims, **ONE})
def node_claims(request: HttpRequest, name: str) -> dict:
    """The node's claims and its ledger."""
    node = _node(name)
    rows = list(node.claims.select_related("created_by", "owner", "team"))
    ledger = _ledger(node, list(node.devices.filter(vanished_at__isnull=True)), rows)
    return {"node": node.name, "ledger": serializers.ledger_summary(ledger), "results": [serializers.claim(c) for c in rows]}


# A write also meets unreadable JSON (400), another media type (415) and an invalid
# body (422); the ledger or a newer version refuses with 409, a missing version with 428.
WRITE = errors(400, 401, 403, 404, 409, 415, 422)


@api.post("/nodes/{node:name}/claims/", url_name="node_claims", response={201: ClaimOut | SeriesOut, **WRITE}, **SENT)
def add_claim(request: HttpRequest, name: str, body: ClaimIn) -> Status:
    """Add a claim to the node: 201 with the claim, or the ledger's refusal. With `repeat`:
    201 with the series and its claims, or 409 series_conflict listing every occurrence
    that does not fit (nothing saved)."""
    _may_book(request.user)
    node = _node(name)
    terms = _terms(body, request.user, None)
    try:
        if body.repeat is not None:
            made = services.save_series(node, _proposed(body), request.user, terms, body.repeat,
                                        quota_override_reason=body.quota_override_reason)
            rows = Claim.objects.select_related(*CLAIM_RELATED).filter(series=made[0].series).order_by("starts_at")
            return Status(201, {"series": str(made[0].series), "results": [serializers.claim(c) for c in rows]})
        saved = services.save_claim(node, _proposed(body), request.user, terms=terms,
                                    quota_override_reason=body.quota_override_reason)
    except services.ClaimError as exc:
        raise ApiError.from_claim_error(exc) from None
    return Status(201, serializers.claim(_reload(saved)))


@read("/claims/{int:pk}/", "claim", response={200: ClaimOut, **ONE})
def claim(request: HttpRequest, pk: int) -> dict:
    """One claim."""
    return serializers.claim(_claim(pk))


@api.put("/claims/{int:pk}/", url_name="claim", response={200: ClaimOut, **WRITE, **errors(428)}, **SENT)
def replace_claim(request: HttpRequest, pk: int, body: ClaimUpdate) -> dict:
    """Replace a claim, checked against the node's other claims; only if it is still the
    version `updated_at` names (409 stale otherwise)."""
    if body.repeat is not None:
        raise ApiError(422, "invalid", "a repeat is given when a booking is made; change each occurrence on its own",
                       field="repeat")
    _may_book(request.user)
    try:
        version = services.parse_version(body.updated_at)
        row = _claim(pk)
        saved = services.save_claim(
            row.node, _proposed(body), request.user, editing=row, expected_updated_at=version, terms=_terms(body, request.user, row),
            quota_override_reason=body.quota_override_reason,
        )
    except services.ClaimError as exc:
        raise ApiError.from_claim_error(exc) from None
    return serializers.claim(_reload(saved))


@api.delete(
    "/claims/{int:pk}/",
    url_name="claim",
    response={204: None, **errors(401, 403, 404, 409, 428)},
    openapi_extra={"parameters": [VERSION]},
)
def delete_claim(request: HttpRequest, pk: int) -> HttpResponse:
    """Delete a claim: 204, only if the claim is still the version ?updated_at= names (409
    stale otherwise). The version goes in the query, not a body: many clients and proxies
    drop the body of a DELETE."""
    _may_book(request.user)
    try:
        # Checked first, as the body of a PUT is: a request without it is refused whatever the claim.
        version = services.parse_version(request.GET.get(services.VERSION_FIELD), action="delete")
        row = _claim(pk)
        services.delete_claim(row, request.user, expected_updated_at=version)
    except services.ClaimError as exc:
        raise ApiError.from_claim_error(exc) from None
    return HttpResponse(status=204)


# --- helpers -------------------------------------------------------------------


# What serializers.claim reads of a claim's relations.
CLAIM_RELATED = ("node", "created_by", "owner", "team")


def _may_book(user) -> None:
    """A claim write from someone in no team is refused before its body is looked at;
    what they may change is then services' to say (gpufleet.claims.rights)."""
    if not rights.of(user).may_book_somewhere():
        raise ApiError(403, "forbidden", "you are in no team, so you may read claims but not book or change them")


def _node_rows(params: Schema) -> QuerySet[Node]:
    """The nodes for the query `params`, filtered and sorted as the overview does,
    but by name unless asked otherwise."""
    return _filtered(NodeFilter(params.model_dump(exclude_none=True), queryset=Node.objects.all(), default_sort="name"))


def _claim_rows(params: Schema) -> QuerySet[Claim]:
    """The claims for the query `params`, filtered as the claims page does."""
    rows = Claim.objects.select_related(*CLAIM_RELATED).order_by("node__name", "name")
    return _filtered(ClaimFilter(params.model_dump(exclude_none=True), queryset=rows))


def _filtered(filters) -> QuerySet:
    """The list a page's FilterSet selects; an invalid value is a 400 naming it,
    never a quietly wider list."""
    if not filters.is_valid():
        raise ApiError(400, "bad_filter", "; ".join(filters.error_messages()))
    return filters.qs


def _node(name: str) -> Node:
    try:
        return Node.objects.get(name=name)
    except Node.DoesNotExist:
        raise ApiError(404, "not_found", f"there is no node {name!r}") from None


def _claim(pk: int) -> Claim:
    try:
        return Claim.objects.select_related(*CLAIM_RELATED).get(pk=pk)
    except Claim.DoesNotExist:
        raise ApiError(404, "not_found", f"there is no claim {pk}: it was deleted, or never existed") from None


def _ledger(node: Node, devices, claims) -> gpu.Ledger:
    """The node's ledger now, from its current devices and its claims in force among `claims`."""
    now = timezone.now()
    return node.ledger(devices=[d for d in devices if not d.vanished], claims=[c for c in claims if c.in_force(now)])


def _reload(saved: Claim) -> Claim:
    return Claim.objects.select_related(*CLAIM_RELATED).get(pk=saved.pk)


def _proposed(body: ClaimIn) -> gpu.Claim:
    return gpu.Claim(name=body.name, count=body.count, device_ids=tuple(str(d) for d in body.device_ids))


def _whole_number(params: QueryDict, name: str, default: int) -> int:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or int(raw) > 1_000_000:
        raise ApiError(400, "bad_parameter", f"{name} must be a whole number from 0", field=name)
    return int(raw)


def _hours(params: QueryDict, name: str, default: float) -> float:
    raw = params.get(name, "").strip()
    if not raw:
        return default
    longest = settings.GPUFLEET_MAX_RESERVATION_DAYS * 24
    try:
        hours = float(raw)
    except ValueError:
        hours = 0.0
    if not 0 < hours <= longest:  # also refuses nan and inf
        raise ApiError(400, "bad_parameter", f"{name} must be a number of hours above 0 and at most {longest}"
                                             " (GPUFLEET_MAX_RESERVATION_DAYS)", field=name)
    return hours


def _moment(params: QueryDict, name: str) -> datetime | None:
    """A time given as ISO 8601 with its time zone; None when left out."""
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise ApiError(400, "bad_parameter", f"{name} must be a time as ISO 8601, e.g. 2026-12-08T09:00:00+01:00",
                       field=name) from None
    if moment.tzinfo is None:
        raise ApiError(400, "bad_parameter", f"{name}: give the time with its time zone, e.g. 2026-12-08T09:00:00+01:00",
                       field=name)
    return moment


def _terms(body: ClaimIn, user, editing: Claim | None) -> services.Terms:
    """The body's owner, team, contact and window; those it leaves out are the stored claim's,
    or for a new claim: owned by the caller, for their only team, no contact, starts now, no end."""
    given = body.model_fields_set
    if editing is not None:
        current = services.Terms(editing.owner, editing.contact, editing.starts_at, editing.ends_at)
    else:
        current = services.Terms(user if user.is_authenticated else None, "", None, None)
    owner = current.owner
    if "owner" in given:
        owner = None if body.owner is None else _user(body.owner)
    return services.Terms(
        owner=owner,
        # None: the stored claim's team, or for a new claim the caller's only one.
        team=_team(body.team) if body.team is not None else None,
        contact=body.contact if "contact" in given else current.contact,
        starts_at=body.starts_at if "starts_at" in given else current.starts_at,
        ends_at=body.ends_at if "ends_at" in given else current.ends_at,
    )


def _team(name: str) -> Team:
    team = Team.objects.filter(name__iexact=name).first()
    if team is None:
        raise ApiError(422, "invalid", f"there is no team {name!r}", field="team")
    return team


def _user(username: str):
    try:
        return get_user_model().objects.get(username=username, is_active=True)
    except get_user_model().DoesNotExist:
        raise ApiError(422, "invalid", f"there is no active user {username!r}", field="owner") from None

