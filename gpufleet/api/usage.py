"""GPU usage in the API: GET /api/usage/ answers the usage report of a period
(docs/usage.md), grouped and narrowed as asked, exactly as `manage.py usage --json`
prints it (gpufleet.usage.query makes both). Every role reads it, as every other read."""

# No `from __future__ import annotations`, as in gpufleet/api/alerts.py.
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Router
from pydantic import create_model

from gpufleet.api.errors import ApiError, errors
from gpufleet.api.schemas import Out
from gpufleet.usage import period, query, report

router = Router()


def _query(name: str, description: str, **schema) -> dict:
    return {"in": "query", "name": name, "required": False, "description": description,
            "schema": {"type": "string", **schema}}


# Read by the view itself (gpufleet.usage.query): a bad value is a 400 bad_parameter naming it.
PARAMETERS = [
    _query("from", "the first day, UTC", format="date"),
    _query("to", "the last day, included; left out: today", format="date"),
    _query("period", "this day, week (from Monday) or month so far, instead of from and to; "
                     "neither: this month so far", enum=list(period.PRESETS)),
    _query("by", "what each row is the usage of", enum=list(report.GROUPS), default=query.DEFAULT_GROUP),
    _query("owner", "only the GPU time of claims this user owned"),
    _query("team", "only the GPU time of claims of this team (its name when counted)"),
    {**_query("claim_id", "only the GPU time this claim held"), "schema": {"type": "integer", "minimum": 0}},
    {**_query("node_id", "only the GPU time of this node"), "schema": {"type": "integer", "minimum": 0}},
    _query("image", "only the GPU time of containers of this image"),
    _query("model", "only the GPU time of GPUs of this model, as nvidia-smi names it"),
]


# Row.as_dict's figures (gpufleet/usage/report.py), in its order, with what each one is.
HOURS = {
    "gpu_hours_reserved": "a claim held",
    "gpu_hours_used": "busy, reserved or not",
    "gpu_hours_idle_reserved": "reserved but not busy",
    "gpu_hours_used_unreserved": "busy on GPUs no claim held",
    "gpu_hours_unknown": "of nodes no snapshot covered: neither used nor idle",
    "gpu_hours_power_unknown": "seen without a power reading",
}
MAYBE = {
    "efficiency": "the reserved hours that were busy, over the reserved hours; null with none reserved",
    "energy_kwh": "drawn over the hours with a power reading; null with none",
    "cost": "in the site's currency; null with no price set",
}

UsageRowOut = create_model(
    "UsageRowOut",
    __base__=Out,
    __doc__="One group's figures (docs/usage.md); the total's key is empty.",
    key=(dict[str, str | int | None], Field(
        description="the group's columns: owner; team; claim_id, claim, node and owner; image; label; node_id "
                    "and node; or model (a claim_id of null: no claim held the GPUs; an empty owner or team: "
                    "none)")),
    **{name: (float, Field(description=f"GPU-hours {words}")) for name, words in HOURS.items()},
    **{name: (float | None, Field(description=words)) for name, words in MAYBE.items()},
)


UsageOut = create_model(
    "UsageOut",
    __base__=Out,
    __doc__="The usage of the days `from` to `to` (UTC, both included), a row per group, largest first.",
    by=(str, Field(json_schema_extra={"enum": list(report.GROUPS)})),
    # Named as the query parameters are: Python keywords, so given by name here.
    **{"from": (str, Field(description="the first day", json_schema_extra={"format": "date"})),
       "to": (str, Field(description="the last day, included", json_schema_extra={"format": "date"}))},
    currency=(str, Field(description="GPUFLEET_CURRENCY, the unit of every cost; empty when unset")),
    rows=(list[UsageRowOut], ...),
    total=(UsageRowOut, ...),
)


@router.api_operation(["GET", "HEAD"], "/usage/", url_name="usage", response={200: UsageOut, **errors(400, 401, 403)},
                      openapi_extra={"parameters": PARAMETERS}, exclude_unset=True)
def usage(request: HttpRequest) -> dict:
    """GPU-hours reserved, used, idle-reserved and used-unreserved, unknown hours, energy
    and cost over the days `from` to `to` (or this `period` so far), a row per `by`
    group, narrowed by owner, team, claim_id, node_id, image and model."""
    try:
        asked = query.read(request.GET, timezone.now())
    except query.QueryError as exc:
        raise ApiError(400, "bad_parameter", str(exc), field=exc.field) from None
    return query.run(asked)
