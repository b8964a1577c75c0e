"""The request bodies the API reads and the answers it gives, as the OpenAPI schema
describes them. Whether a claim fits the node is not decided here but by the ledger
(gpufleet.claims.services); the bodies only say what a well-formed one is. The answers
are made by gpufleet.api.serializers and checked against these on the way out."""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from datetime import datetime
from typing import Annotated, Any

import django_filters
from ninja import Schema
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    StringConstraints,
    create_model,
    field_validator,
)
from pydantic_core import PydanticCustomError

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.events.models import Kind, Muted, Severity
from gpufleet.fleet.models import Attach, FindingStatus, Health

ClaimName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=Claim._meta.get_field("name").max_length)
]


class ClaimIn(Schema):
    """A new claim: `count` GPUs, or the `device_ids` named (GPU indexes or UUIDs);
    neither, or count 0, means every GPU."""

    # A misspelt "device_ids" must not silently become a claim on every GPU.
    model_config = ConfigDict(extra="forbid")

    name: ClaimName
    # Before `count`, so that the check on count can see whether devices were named.
    device_ids: list[StrictInt | StrictStr] = Field(default_factory=list)
    count: Annotated[StrictInt, Field(ge=0)] = 0
    # Omitted: a new claim is owned by the caller, starts now, has no end and no contact;
    # a replaced one keeps its own. `owner` is a username (null: nobody); `starts_at` and
    # `ends_at` are ISO 8601 with a time zone (starts_at null: now; ends_at null: no end).
    owner: str | None = None
    team: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)] | None = Field(
        None, description="the team's name; omitted: a replaced claim keeps its team, a new one is for the "
                          "caller's only team (422 naming the teams to choose from when they are in several)")
    contact: Annotated[str, StringConstraints(max_length=Claim._meta.get_field("contact").max_length)] = ""
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    # A new claim only: repeat its window by an iCalendar RRULE with an end (docs/claims.md).
    repeat: Annotated[str, StringConstraints(max_length=500)] | None = Field(
        None, description="repeat the window by an iCalendar RRULE with an end (COUNT or UNTIL),"
                          " e.g. FREQ=WEEKLY;BYDAY=TU;COUNT=12: one claim per occurrence, all or none")
    quota_override_reason: Annotated[str, StringConstraints(max_length=1000)] | None = Field(
        None, description="admins only: book over the team's quota, saying why (403 forbidden from anyone else);"
                          " omitted on a replace: the claim keeps its own")

    @field_validator("starts_at", "ends_at")
    @classmethod
    def _zoned(cls, moment: datetime | None) -> datetime | None:
        # A time without a zone means a different instant on each machine that reads it.
        if moment is not None and moment.tzinfo is None:
            raise PydanticCustomError("time_zone", "give the time with its time zone, e.g. 2026-12-08T09:00:00+01:00")
        return moment

    @field_validator("count")
    @classmethod
    def _count_or_devices(cls, count: int, info) -> int:
        if count and info.data.get("device_ids"):
            raise PydanticCustomError("count_and_devices", "give either count or device_ids, not both")
        return count


class ClaimUpdate(ClaimIn):
    """A claim's replacement. `updated_at` is required: the claim's `updated_at` as last read,
    so a change made meanwhile is never overwritten unseen (409 stale). Missing or unreadable:
    428 version_required; nothing is written either way."""

    updated_at: str = Field(
        description="The claim's updated_at exactly as read (ISO 8601 with time zone); required."
    )


# --- answers -------------------------------------------------------------------------


class Out(BaseModel):
    """An answer: keys are only ever added, so a key the schema does not name yet passes
    through rather than being dropped (tests/api/test_openapi.py holds the two equal).
    A plain pydantic model: ninja's Schema reads its input as attributes, which drops them."""

    model_config = ConfigDict(extra="allow")


def _time(description: str = "") -> Any:
    # Sent as Python writes ISO 8601 (the claim's version must come back exactly as read),
    # so a string here rather than a datetime that would be written anew.
    return Field(description=description or None, json_schema_extra={"format": "date-time"})


def _one_of(values, description: str) -> Any:
    return Field(description=description, json_schema_extra={"enum": list(values)})


Time = str | None


class NodeSummary(Out):
    """One node as listed: the figures kept on the node row."""

    name: str
    status: str = _one_of(Health.values, "health as shown: offline when it stopped reporting")
    health: str = _one_of(FindingStatus.values, "its worst finding, as last reported")
    gpu_count: int
    vram_total_mib: int
    vram_used_mib: int
    gpus_reserved: int
    gpus_free: int
    gpus_lost: int = Field(description="GPUs the node had and no longer reports")
    problem: str = Field(description="its worst finding in words; empty when all is well")
    driver_version: str
    toolkit_version: str
    attach: str = _one_of(Attach.values, "how containers get its GPUs")
    last_seen: Time = _time()
    collected_at: Time = _time()


class LedgerOut(Out):
    total: int
    reserved: int
    free: int
    holders: list[str]


def _device_fields() -> dict[str, Any]:
    """The domain's device fields (gpu.Device, the one list), as its to_dict writes them:
    tuples as lists, records as objects."""

    def as_json(hint):
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            return functools.reduce(operator.or_, (as_json(arg) for arg in typing.get_args(hint)))
        if typing.get_origin(hint) is tuple:
            item = typing.get_args(hint)[0]
            return list[dict[str, Any] if dataclasses.is_dataclass(item) else item]
        return hint

    hints = typing.get_type_hints(gpu.Device)
    # to_dict writes every field, so every one is required.
    return {f.name: (as_json(hints[f.name]), ...) for f in dataclasses.fields(gpu.Device)}


DeviceOut = create_model(
    "DeviceOut",
    __base__=Out,
    __doc__="A GPU with the doctor's health keys; `holder` is the claim pinning it (or taking every GPU).",
    **_device_fields(),
    last_seen=(Time, _time()),
    vanished_at=(Time, _time("when the node stopped reporting it; null while it does")),
    holder=(str | None, None),
)


class FindingOut(Out):
    code: str
    name: str
    status: str = _one_of(FindingStatus.values, "ok, warn or fail")
    message: str
    fix: str | None = Field(None, description="a command or remedy; absent when there is none")


class ClaimOut(Out):
    """A claim; `mode` is count, all or devices."""

    id: int
    node: str
    name: str
    mode: str = _one_of(["count", "all", "devices"], "count: `count` GPUs; all: every GPU; devices: `device_ids`")
    count: int
    device_ids: list[str]
    missing_devices: list[str] = Field(description="named GPUs the node no longer reports")
    created_by: str | None
    owner: str | None
    team: str | None = Field(description="the team the claim is for; null only for rows written by the system")
    contact: str
    starts_at: Time = _time("when the claim starts holding its GPUs")
    ends_at: Time = _time("when it stops holding them; null: no end")
    in_force: bool = Field(description="holds its GPUs now: started and not ended")
    ended: bool
    series: str | None = Field(description="the repeating booking the claim is an occurrence of; null: none")
    created_at: Time = _time()
    updated_at: Time = _time("the claim's version: send it back exactly as read to change or delete it")
    quota_override_reason: str = Field(description="why an admin booked it over its team's quota; empty: within them")


class SeriesOut(Out):
    """A repeating booking just made: its occurrences, one claim each, in order."""

    series: str
    results: list[ClaimOut]


class EventOut(Out):
    """An event of the fleet: open while `closed_at` is null (docs/events.md)."""

    id: int
    kind: str = _one_of(Kind.values, "what changed")
    severity: str = _one_of(Severity.values, "the worst it reached while open")
    node: str | None = Field(description="null: the site's")
    gpu_index: int | None
    pci_bus_id: str
    code: str = Field(description="the finding code, the GPU's UUID, the refusal reason or the claim's name")
    message: str = Field(description="the latest words")
    opened_at: Time = _time()
    closed_at: Time = _time("null while open")
    muted: str = _one_of(Muted.values, "why its notifications were held back while open: its node was in maintenance "
                                       "or a silence covered it; empty: they were not")


class NodeDetail(NodeSummary):
    """One node with its devices, findings, claims and ledger."""

    present: bool
    runtime_installed: bool
    cdi_spec_files: list[str]
    cdi_devices: list[str]
    utilization_mean: float | None
    first_seen: Time = _time()
    ledger: LedgerOut
    devices: list[DeviceOut]
    findings: list[FindingOut]
    claims: list[ClaimOut]


class NodeDevices(Out):
    node: str
    results: list[DeviceOut]


class NodeFindings(Out):
    node: str
    results: list[FindingOut]


class NodeClaims(Out):
    node: str
    ledger: LedgerOut
    results: list[ClaimOut]


class FitOut(Out):
    node: str
    gpus: int = Field(description="GPUs the claim would take")
    left_over: int = Field(description="free GPUs the node keeps after it")
    free_vram_mib: int = Field(description="free VRAM on the GPUs it would likely get")


class RuledOutOut(Out):
    node: str
    code: str
    reason: str


class SlotGpuOut(Out):
    index: int
    uuid: str


class SlotOut(Out):
    """One node's earliest window for the GPUs asked: book them with these `gpus`' UUIDs
    as device_ids and this window (POST /api/nodes/{node}/claims/)."""

    node: str
    gpus: list[SlotGpuOut]
    starts_at: str = _time("ISO 8601, UTC")
    ends_at: str = _time("ISO 8601, UTC")


class AvailabilityOut(Out):
    """The question as understood (`after`: never before now), and each node's earliest
    window for it, best first."""

    count: int
    model: str
    min_free_vram_mib: int
    duration_hours: float
    after: str = _time("ISO 8601, UTC")
    windows: list[SlotOut]


class PlacementOut(Out):
    count: int
    model: str
    min_free_vram_mib: int
    fits: list[FitOut]
    ruled_out_counts: dict[str, int]
    ruled_out: list[RuledOutOut]


# --- query parameters ----------------------------------------------------------------


def filter_query(filters: type[django_filters.FilterSet], *, exclude: tuple[str, ...] = ()) -> type[Schema]:
    """The query parameters of a list, made from the FilterSet of its page: one parameter
    per filter, described by its label, a choice's values as the enum. Every value is taken
    as text and left to the FilterSet to judge, so a list answers a bad value as its page
    does (400 bad_filter naming it) and there is one rule for each filter."""
    fields: dict[str, Any] = {}
    # An instance's filters know their model, so each has its label (a bound page's own).
    for name, declared in filters().filters.items():
        if name in exclude:
            continue
        documented: dict[str, Any] = {}
        if isinstance(declared, django_filters.ChoiceFilter):
            choices = declared.extra["choices"]
            documented["enum"] = [value for value, _ in (choices() if callable(choices) else choices) if value != ""]
        if declared.extra.get("max_length"):
            documented["maxLength"] = declared.extra["max_length"]
        # Typed `str` with no value by default (not `str | None`): the parameter is text or absent.
        fields[name] = (str, Field(None, description=str(declared.label), json_schema_extra=documented or None))
    return create_model(f"{filters.__name__}Query", __base__=Schema, **fields)
