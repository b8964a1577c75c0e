"""The agent<->central message: the snapshot an agent sends after each
collection (the doctor report plus `schema_version`, `collected_at` and what the
agent may fix), and the names of the tasks each side sends the other. The agent
and the ingest both import it from here; it imports only the domain.

The agent builds it with `build_snapshot`; ingest accepts it only through
`parse_snapshot`, which is strict: unknown keys, wrong types, or inconsistent
values are rejected with a reason, never half-stored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufleet import gpu

SNAPSHOT_SCHEMA_VERSION = 2
# Version 1 devices carry only the reference fields; their health fields stay unknown.
ACCEPTED_SCHEMA_VERSIONS = (1, 2)

# Task names on the broker. They are the wire protocol between agents and the
# centre, so they keep the names of the first release: agents already deployed
# go on sending to them.
INGEST_TASK = "gpufleet.fleet.tasks.ingest"
JOB_PROGRESS_TASK = "gpufleet.jobs.tasks.job_progress"
COLLECT_TASK = "gpufleet.agent.tasks.collect"
APPLY_FIX_TASK = "gpufleet.agent.tasks.apply_fix"
INGEST_QUEUE = "ingest"


def agent_queue(node: str) -> str:
    """The queue a node's agent consumes."""
    return f"node.{node}"

_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)
_Text = Annotated[str, Field(max_length=4000)]
_Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class SnapshotError(ValueError):
    """A snapshot that cannot be ingested; the message says why."""


_Count = Annotated[int, Field(ge=0, le=2**62)]
_Reading = Annotated[int, Field(ge=0, le=100_000)]
_Watts = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]


class MigDeviceIn(BaseModel):
    model_config = _Strict
    uuid: Annotated[str, Field(min_length=1, max_length=100)]
    profile: Annotated[str, Field(max_length=32)]
    device: Annotated[int, Field(ge=0, le=1023)]


class XidCountIn(BaseModel):
    model_config = _Strict
    xid: Annotated[int, Field(ge=0, le=100_000)]
    count: _Count
    last_seen: Annotated[str, Field(max_length=40)] | None
    description: Annotated[str, Field(max_length=200)]


class DeviceIn(BaseModel):
    model_config = _Strict
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: Annotated[str, Field(min_length=1, max_length=100)]
    name: Annotated[str, Field(max_length=200)]
    vram_total_mib: Annotated[int, Field(ge=0)] | None
    vram_used_mib: Annotated[int, Field(ge=0)] | None
    utilization_percent: Annotated[int, Field(ge=0, le=100)] | None
    pci_bus_id: Annotated[str, Field(max_length=32)] | None = None
    temperature_c: _Reading | None = None
    memory_temperature_c: _Reading | None = None
    power_draw_w: _Watts | None = None
    power_limit_w: _Watts | None = None
    fan_percent: Annotated[int, Field(ge=0, le=100)] | None = None
    pstate: Annotated[str, Field(max_length=8)] | None = None
    sm_clock_mhz: _Reading | None = None
    sm_clock_max_mhz: _Reading | None = None
    persistence_mode: bool | None = None
    ecc_mode: bool | None = None
    ecc_corrected_volatile: _Count | None = None
    ecc_uncorrected_volatile: _Count | None = None
    ecc_uncorrected_aggregate: _Count | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: _Count | None = None
    remapped_rows_uncorrectable: _Count | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    throttle_reasons: list[Literal[gpu.THROTTLE_REASONS]] | None = None  # type: ignore[valid-type]
    mig_mode: bool | None = None
    mig_devices: Annotated[list[MigDeviceIn], Field(max_length=64)] = []
    xid_errors: Annotated[list[XidCountIn], Field(max_length=64)] = []


class FindingIn(BaseModel):
    model_config = _Strict
    code: Annotated[str, Field(min_length=1, max_length=64)]
    name: Annotated[str, Field(max_length=200)]
    status: Literal["ok", "warn", "fail"]
    message: _Text
    fix: _Text = ""


class Snapshot(BaseModel):
    model_config = _Strict
    schema_version: Literal[ACCEPTED_SCHEMA_VERSIONS]  # type: ignore[valid-type]
    node: _Name
    collected_at: datetime
    present: bool
    driver_version: Annotated[str, Field(max_length=64)]
    devices: Annotated[list[DeviceIn], Field(max_length=1024)]
    runtime_installed: bool
    toolkit_version: Annotated[str, Field(max_length=200)]
    cdi_spec_files: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=256)]
    cdi_devices: Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=4096)]
    attach: Literal["cdi", "legacy", "none"]
    findings: Annotated[list[FindingIn], Field(min_length=1, max_length=2048)]
    fixes_allowed: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=64)] = []

    @field_validator("collected_at", mode="before")
    @classmethod
    def _iso_timestamp(cls, value: Any) -> datetime:
        # JSON carries timestamps as ISO strings; strict mode would refuse them.
        if not isinstance(value, str):
            raise ValueError("collected_at must be an ISO 8601 string")
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError("collected_at must carry a time zone")
        return parsed

    @model_validator(mode="after")
    def _consistent(self) -> Snapshot:
        uuids = [d.uuid.lower() for d in self.devices]
        if len(set(uuids)) != len(uuids):
            raise ValueError("a GPU UUID appears twice")
        indexes = [d.index for d in self.devices]
        if len(set(indexes)) != len(indexes):
            raise ValueError("a GPU index appears twice")
        codes = [f.code for f in self.findings]
        if len(set(codes)) != len(codes):
            raise ValueError("a finding code appears twice")
        if self.devices and not self.present:
            raise ValueError("devices listed although present is false")
        return self


def parse_snapshot(data: Any) -> Snapshot:
    """Validate one snapshot as received from the broker (a JSON-decoded dict)."""
    if not isinstance(data, dict):
        raise SnapshotError(f"snapshot must be a JSON object, not {type(data).__name__}")
    version = data.get("schema_version")
    if version not in ACCEPTED_SCHEMA_VERSIONS:
        accepted = ", ".join(map(str, ACCEPTED_SCHEMA_VERSIONS))
        raise SnapshotError(f"unsupported schema_version {version!r} (this site reads {accepted})")
    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'snapshot'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise SnapshotError(f"invalid snapshot: {problems}") from None


def build_snapshot(
    diagnosis: gpu.HostDiagnosis,
    node: str,
    fixes_allowed: list[str] | tuple[str, ...] = (),
    collected_at: datetime | None = None,
) -> dict:
    """The JSON-ready snapshot of one collection on this host."""
    collected_at = collected_at or datetime.now(UTC)
    return {
        "schema_version": SNAPSHOT_SCHEMA_VERSION,
        **diagnosis.to_dict(node),
        "collected_at": collected_at.isoformat(),
        "fixes_allowed": list(fixes_allowed),
    }
