"""Request bodies the API reads. Whether a claim fits the node is not decided here but by
the ledger (gpufleet.claims.services); these only say what a well-formed body is."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from ninja import Schema
from pydantic import ConfigDict, Field, StrictInt, StrictStr, StringConstraints, field_validator
from pydantic_core import PydanticCustomError

from gpufleet.claims.models import Claim

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
    # Omitted: a new claim is owned by the caller, never ends and has no contact; a
    # replaced one keeps its own. `owner` is a username (null: nobody), `expires_at`
    # ISO 8601 with a time zone (null: never).
    owner: str | None = None
    contact: Annotated[str, StringConstraints(max_length=Claim._meta.get_field("contact").max_length)] = ""
    expires_at: datetime | None = None

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
