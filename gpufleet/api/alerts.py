"""The alerts in the API, as their pages have them: channels, rules and silences (the
admin role writes, with a read-write token or the session; every role reads) and
deliveries (read). A channel's URL is write-only: answers carry `redacted`, its scheme
alone (docs/alerts.md)."""

# No `from __future__ import annotations`: ninja reads the paginated views' parameters
# through @paginate's wrapper, whose module cannot resolve names written as strings.
from datetime import datetime
from typing import Annotated

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema, Status
from ninja.pagination import paginate
from pydantic import StringConstraints, field_validator

from gpufleet.alerts import channels as apprise_urls
from gpufleet.alerts import services
from gpufleet.alerts.models import Channel, Delivery, Format, Rule, Silence
from gpufleet.alerts.models import Status as DeliveryStatus
from gpufleet.api.errors import ApiError, errors
from gpufleet.api.pagination import Pages
from gpufleet.api.schemas import Out, Time
from gpufleet.core.access import MANAGE_ALERTS, can
from gpufleet.events.models import Kind, Muted, Severity

router = Router()

SENT = {"exclude_unset": True}
LIST = errors(400, 401, 403, 404)
ONE = errors(401, 403, 404)
WRITE = errors(400, 401, 403, 404, 415, 422)
NEW = errors(400, 401, 403, 415, 422)

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
Glob = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)]


def read(path: str, name: str, **options):
    return router.api_operation(["GET", "HEAD"], path, url_name=name, **SENT, **options)


def _admin(request: HttpRequest) -> None:
    """Writes are the admin role's (the API's auth already refused read tokens)."""
    if not can(request.user, MANAGE_ALERTS):
        raise ApiError(403, "forbidden", "your role may not manage alerts")


# --- channels --------------------------------------------------------------------------


class ChannelIn(Schema):
    name: Name
    url: str = Field(description="an apprise URL (mailto://, json://, slack://, ...), or for the alertmanager "
                     "format an http(s):// or json(s):// URL; write-only", min_length=1, max_length=2000)
    format: Format = Field(Format.APPRISE, description="apprise: the service's own message; alertmanager: "
                           "Alertmanager's webhook body (version 4)")


class ChannelUpdate(Schema):
    name: Name
    url: str | None = Field(None, description="a whole new URL; left out or null: the URL stays",
                            max_length=2000)
    format: Format | None = Field(None, description="apprise or alertmanager; left out or null: it stays")


class ChannelOut(Out):
    """A channel; its URL never comes back, only its scheme."""

    id: int
    name: str
    redacted: str = Field(description="the URL's scheme alone, such as json://…")
    format: str = Field(description="apprise or alertmanager: what it sends")
    failing: bool = Field(description="a notification to it failed every try since the last one sent")
    failing_since: Time
    last_error: str = Field(description="why its last failed notification failed, without the URL")
    last_sent_at: Time


class ChannelTestOut(Out):
    sent: bool
    error: str


def _channel(row: Channel) -> dict:
    return {"id": row.pk, "name": row.name, "redacted": row.redacted, "format": row.format, "failing": row.failing,
            "failing_since": _iso(row.failing_since), "last_error": row.last_error,
            "last_sent_at": _iso(row.last_sent_at)}


def _checked_url(url: str, format: str = Format.APPRISE) -> str:
    if (problem := apprise_urls.problem(url, format)) is not None:
        raise ApiError(422, "invalid", f"url: {problem}", "url")
    return url


def _unique_channel_name(name: str, editing: Channel | None = None) -> None:
    taken = Channel.objects.filter(name=name)
    if editing is not None:
        taken = taken.exclude(pk=editing.pk)
    if taken.exists():
        raise ApiError(422, "invalid", f"name: there is a channel {name!r} already", "name")


@read("/channels/", "channels", response={200: list[ChannelOut], **LIST})
@paginate(Pages, serialize=_channel)
def channel_list(request: HttpRequest) -> QuerySet[Channel]:
    """Every alert channel, by name."""
    return Channel.objects.order_by("name")


@router.post("/channels/", url_name="channels", response={201: ChannelOut, **NEW}, **SENT)
def channel_add(request: HttpRequest, body: ChannelIn) -> Status:
    """Add a channel (admin role). Its URL is checked by apprise and never shown again."""
    _admin(request)
    _unique_channel_name(body.name)
    return Status(201, _channel(services.save_channel(request.user, body.name, _checked_url(body.url, body.format),
                                                      format=body.format)))


@read("/channels/{int:pk}/", "channel", response={200: ChannelOut, **ONE})
def channel_one(request: HttpRequest, pk: int) -> dict:
    """One channel."""
    return _channel(_get(Channel, pk, "channel"))


@router.put("/channels/{int:pk}/", url_name="channel", response={200: ChannelOut, **WRITE}, **SENT)
def channel_replace(request: HttpRequest, pk: int, body: ChannelUpdate) -> dict:
    """Rename a channel, or give it a new URL (admin role)."""
    _admin(request)
    row = _get(Channel, pk, "channel")
    _unique_channel_name(body.name, row)
    format = body.format or row.format
    # A new format must suit the URL kept, and a new URL the format.
    _checked_url(body.url or row.url, format)
    url = body.url or None
    return _channel(services.save_channel(request.user, body.name, url, editing=row, format=format))


@router.delete("/channels/{int:pk}/", url_name="channel", response={204: None, **ONE})
def channel_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Delete a channel (admin role); rules stop sending there."""
    _admin(request)
    services.delete_channel(request.user, _get(Channel, pk, "channel"))
    return HttpResponse(status=204)


@router.post("/channels/{int:pk}/test", url_name="channel_test", response={200: ChannelTestOut, **ONE}, **SENT)
def channel_test(request: HttpRequest, pk: int) -> dict:
    """Send a test notification to the channel now (admin role): whether it went, and
    apprise's reason if not (without the URL)."""
    _admin(request)
    outcome = services.send_test(_get(Channel, pk, "channel"))
    return {"sent": outcome.sent, "error": outcome.error}


# --- rules -----------------------------------------------------------------------------


class RuleIn(Schema):
    """A rule: which events (kinds, at least min_severity, on nodes matching the glob
    `nodes` and with a GPU whose name holds `gpu_model`) go to which channels (by name),
    once open `wait_minutes`, again every `repeat_hours` (0: never), and when closed if
    `notify_resolved`."""

    name: Name
    channels: list[str] = Field(default_factory=list, description="channel names")
    kinds: list[str] = Field(default_factory=list, description=f"event kinds ({', '.join(Kind.values)}); "
                                                               "empty: every kind")
    min_severity: str = Field(Severity.FAIL.value, json_schema_extra={"enum": Severity.values})
    nodes: Glob = Field("", description="node names as a glob (gpu-*); empty: every node")
    gpu_model: Annotated[str, StringConstraints(strip_whitespace=True, max_length=100)] = ""
    wait_minutes: int = Field(5, ge=0, le=10_080)
    repeat_hours: int = Field(0, ge=0, le=8_760, description="0: never")
    notify_resolved: bool = True
    enabled: bool = True

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, kinds: list[str]) -> list[str]:
        unknown = sorted(set(kinds) - set(Kind.values))
        if unknown:
            raise ValueError(f"no such event kind: {', '.join(unknown)}")
        return sorted(set(kinds), key=Kind.values.index)

    @field_validator("min_severity")
    @classmethod
    def _known_severity(cls, severity: str) -> str:
        if severity not in Severity.values:
            raise ValueError(f"one of {', '.join(Severity.values)}")
        return severity


class RuleOut(Out):
    id: int
    name: str
    channels: list[str]
    kinds: list[str]
    min_severity: str
    nodes: str
    gpu_model: str
    wait_minutes: int
    repeat_hours: int
    notify_resolved: bool
    enabled: bool


def _rule(row: Rule) -> dict:
    return {"id": row.pk, **services.rule_state(row)}


def _save_rule(request: HttpRequest, body: RuleIn, editing: Rule | None) -> Rule:
    _admin(request)
    taken = Rule.objects.filter(name=body.name)
    if editing is not None:
        taken = taken.exclude(pk=editing.pk)
    if taken.exists():
        raise ApiError(422, "invalid", f"name: there is a rule {body.name!r} already", "name")
    chosen = list(Channel.objects.filter(name__in=body.channels))
    missing = sorted(set(body.channels) - {c.name for c in chosen})
    if missing:
        raise ApiError(422, "invalid", f"channels: no such channel: {', '.join(missing)}", "channels")
    values = body.model_dump(include=set(services.RULE_FIELDS))
    return services.save_rule(request.user, values, chosen, editing=editing)


def _rules() -> QuerySet[Rule]:
    return Rule.objects.prefetch_related("channels").order_by("name")


@read("/rules/", "rules", response={200: list[RuleOut], **LIST})
@paginate(Pages, serialize=_rule)
def rule_list(request: HttpRequest) -> QuerySet[Rule]:
    """Every alert rule, by name."""
    return _rules()


@router.post("/rules/", url_name="rules", response={201: RuleOut, **NEW}, **SENT)
def rule_add(request: HttpRequest, body: RuleIn) -> Status:
    """Add a rule (admin role)."""
    saved = _save_rule(request, body, None)
    return Status(201, _rule(_rules().get(pk=saved.pk)))


@read("/rules/{int:pk}/", "rule", response={200: RuleOut, **ONE})
def rule_one(request: HttpRequest, pk: int) -> dict:
    """One rule."""
    return _rule(_get(_rules(), pk, "rule"))


@router.put("/rules/{int:pk}/", url_name="rule", response={200: RuleOut, **WRITE}, **SENT)
def rule_replace(request: HttpRequest, pk: int, body: RuleIn) -> dict:
    """Replace a rule (admin role): fields left out take their defaults."""
    _admin(request)
    saved = _save_rule(request, body, _get(_rules(), pk, "rule"))
    return _rule(_rules().get(pk=saved.pk))


@router.delete("/rules/{int:pk}/", url_name="rule", response={204: None, **ONE})
def rule_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """Delete a rule (admin role); its deliveries stay listed."""
    _admin(request)
    services.delete_rule(request.user, _get(_rules(), pk, "rule"))
    return HttpResponse(status=204)


# --- silences --------------------------------------------------------------------------


class SilenceIn(Schema):
    nodes: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)] = Field(
        description="node names as a glob (gpu-*, rack4-??); * every node and the site")
    starts_at: datetime | None = Field(None, description="ISO 8601 with time zone; left out: now")
    ends_at: datetime = Field(description="ISO 8601 with time zone")
    reason: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]


class SilenceOut(Out):
    id: int
    nodes: str
    starts_at: Time
    ends_at: Time
    reason: str
    author: str | None
    active: bool


def _silence(row: Silence) -> dict:
    return {"id": row.pk, "nodes": row.nodes, "starts_at": _iso(row.starts_at), "ends_at": _iso(row.ends_at),
            "reason": row.reason, "author": row.author_name or None, "active": row.is_active()}


@read("/silences/", "silences", response={200: list[SilenceOut], **LIST})
@paginate(Pages, serialize=_silence)
def silence_list(request: HttpRequest, active: bool | None = Query(None, description="true: only those in force now")) \
        -> QuerySet[Silence]:
    """Every silence, those ending last first."""
    rows = Silence.objects.order_by("-ends_at", "-id")
    return rows.active() if active else rows


@router.post("/silences/", url_name="silences", response={201: SilenceOut, **NEW}, **SENT)
def silence_add(request: HttpRequest, body: SilenceIn) -> Status:
    """Silence the nodes matching `nodes` from `starts_at` (now) to `ends_at` (admin role)."""
    _admin(request)
    starts = body.starts_at or datetime.now(tz=body.ends_at.tzinfo)
    if body.ends_at.tzinfo is None or (body.starts_at is not None and body.starts_at.tzinfo is None):
        raise ApiError(422, "invalid", "ends_at: give a time zone (2026-03-02T18:00:00Z)", "ends_at")
    if body.ends_at <= starts:
        raise ApiError(422, "invalid", "ends_at: a silence ends after it starts", "ends_at")
    return Status(201, _silence(services.save_silence(request.user, body.nodes, starts, body.ends_at, body.reason)))


@read("/silences/{int:pk}/", "silence", response={200: SilenceOut, **ONE})
def silence_one(request: HttpRequest, pk: int) -> dict:
    """One silence."""
    return _silence(_get(Silence, pk, "silence"))


@router.delete("/silences/{int:pk}/", url_name="silence", response={204: None, **ONE})
def silence_end(request: HttpRequest, pk: int) -> HttpResponse:
    """End a silence now (admin role); one not yet started goes."""
    _admin(request)
    services.end_silence(request.user, _get(Silence, pk, "silence"))
    return HttpResponse(status=204)


# --- deliveries ------------------------------------------------------------------------


class DeliveryOut(Out):
    id: int
    rule: str
    channel: str
    notice: str = Field(json_schema_extra={"enum": ["opened", "repeat", "resolved"]})
    status: str = Field(json_schema_extra={"enum": DeliveryStatus.values})
    events: list[int] = Field(description="the ids of its events (GET /api/events/)")
    tries: int
    error: str = Field(description="why the last try failed, without the channel's URL")
    muted: str = Field(json_schema_extra={"enum": Muted.values},
                       description="why it was held back (status silenced): silenced or maintenance")
    silence: int | None = Field(description="the silence that held it back (GET /api/silences/)")
    title: str = Field(description="what it said, or would have said when held back")
    created_at: Time
    next_try_at: Time
    sent_at: Time


def _delivery(row: Delivery) -> dict:
    return {"id": row.pk, "rule": row.rule_name, "channel": row.channel_name, "notice": row.notice,
            "status": row.status, "events": sorted(item.event_id for item in row.items.all()), "tries": row.tries,
            "error": row.error, "muted": row.muted, "silence": row.silence_id, "title": row.title,
            "created_at": _iso(row.created_at),
            "next_try_at": _iso(row.next_try_at), "sent_at": _iso(row.sent_at)}


@read("/deliveries/", "deliveries", response={200: list[DeliveryOut], **LIST})
@paginate(Pages, serialize=_delivery)
def delivery_list(request: HttpRequest,
                  status: str | None = Query(None, description="pending, sending, sent, failed or silenced"),
                  channel: str | None = Query(None, description="a channel's name")) -> QuerySet[Delivery]:
    """Every notification, newest first."""
    rows = Delivery.objects.prefetch_related("items").order_by("-created_at", "-id")
    if status:
        if status not in DeliveryStatus.values:
            raise ApiError(400, "bad_filter", f"status: one of {', '.join(DeliveryStatus.values)}", "status")
        rows = rows.filter(status=status)
    if channel:
        rows = rows.filter(channel_name=channel)
    return rows


# --- helpers ---------------------------------------------------------------------------


def _get(source, pk: int, what: str):
    rows = source if isinstance(source, QuerySet) else source.objects.all()
    try:
        return rows.get(pk=pk)
    except rows.model.DoesNotExist:
        raise ApiError(404, "not_found", f"there is no {what} {pk}") from None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
