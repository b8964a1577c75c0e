"""The snapshot schema the centre validates what agents send against: strict pydantic
models of the message gpufleet/wire.py describes (its limits are the wire's), and
`parse_snapshot`, the one way ingest reads a snapshot."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gpufleet import gpu
from gpufleet.wire import (
    CDI_DEVICES_MAX,
    CDI_SPEC_FILES_MAX,
    CDI_SPEC_PATH_MAX,
    CENTRE_ONLY_CODES,
    CODE_MAX,
    CONTAINERS_PER_GPU_MAX,
    DEVICE_LISTS,
    DRIVER_VERSION_MAX,
    FINDINGS_MAX,
    FIXES_ALLOWED_MAX,
    GPUS_PER_NODE_MAX,
    LINE_MAX,
    MIG_SLICES_PER_GPU_MAX,
    NVLINKS_PER_GPU_MAX,
    OLDEST_SNAPSHOT,
    PROCESSES_PER_GPU_MAX,
    SNAPSHOT_SCHEMA_VERSION,
    TEXT_MAX,
    XIDS_PER_GPU_MAX,
    CentreOnlyFinding,
    SnapshotError,
    decode_snapshot,
)

_Strict = ConfigDict(extra="forbid", strict=True, frozen=True)
# No NUL or other control characters reach the database or the pages; messages
# may keep tabs and newlines.
_NO_CONTROL = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"
_ONE_LINE = r"^[^\x00-\x1f\x7f]*$"

_Text = Annotated[str, Field(max_length=TEXT_MAX, pattern=_NO_CONTROL)]
_Line = Annotated[str, Field(max_length=LINE_MAX, pattern=_ONE_LINE)]
_Code = Annotated[str, Field(min_length=1, max_length=CODE_MAX, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]
_Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# Within 64 bits with room to add them up.
_MiB = Annotated[int, Field(ge=0, le=2**52)]

_CENTRE_ONLY = "centre_only_code"  # the validation error's type, for parse_snapshot


_Count = Annotated[int, Field(ge=0, le=2**62)]
_Reading = Annotated[int, Field(ge=0, le=100_000)]
_Watts = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]


class MigDeviceIn(BaseModel):
    model_config = _Strict
    uuid: Annotated[str, Field(min_length=1, max_length=100, pattern=_ONE_LINE)]
    profile: Annotated[str, Field(max_length=32, pattern=_ONE_LINE)]
    device: Annotated[int, Field(ge=0, le=1023)]


class XidCountIn(BaseModel):
    model_config = _Strict
    xid: Annotated[int, Field(ge=0, le=100_000)]
    count: _Count
    last_seen: Annotated[str, Field(max_length=40, pattern=_ONE_LINE)] | None
    description: _Line


class ContainerIn(BaseModel):
    model_config = _Strict
    id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")]
    name: _Line
    image: _Line
    claim: _Line | None  # the gpufleet.claim label, None on a container without one


class ProcessIn(BaseModel):
    model_config = _Strict
    pid: Annotated[int, Field(ge=0, le=2**32)]
    name: _Line
    used_mib: _MiB | None
    container: ContainerIn | None


class NvLinkIn(BaseModel):
    model_config = _Strict
    link: Annotated[int, Field(ge=0, le=255)]
    state: Literal["up", "down"]
    replay_errors: _Count | None
    recovery_errors: _Count | None
    crc_errors: _Count | None


class DeviceIn(BaseModel):
    model_config = _Strict
    index: Annotated[int, Field(ge=0, le=1023)]
    uuid: Annotated[str, Field(min_length=1, max_length=100, pattern=_ONE_LINE)]
    name: _Line
    vram_total_mib: _MiB | None
    vram_used_mib: _MiB | None
    utilization_percent: Annotated[int, Field(ge=0, le=100)] | None
    pci_bus_id: Annotated[str, Field(max_length=32, pattern=_ONE_LINE)] | None = None
    temperature_c: _Reading | None = None
    memory_temperature_c: _Reading | None = None
    power_draw_w: _Watts | None = None
    power_limit_w: _Watts | None = None
    fan_percent: Annotated[int, Field(ge=0, le=100)] | None = None
    pstate: Annotated[str, Field(max_length=8, pattern=_ONE_LINE)] | None = None
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
    # An older agent sends none of these: they stay unknown.
    pcie_link_gen: Annotated[int, Field(ge=1, le=32)] | None = None
    pcie_link_gen_max: Annotated[int, Field(ge=1, le=32)] | None = None
    pcie_link_width: Annotated[int, Field(ge=1, le=64)] | None = None
    pcie_link_width_max: Annotated[int, Field(ge=1, le=64)] | None = None
    power_draw_average_w: _Watts | None = None
    sw_power_cap_us: _Count | None = None
    sw_thermal_slowdown_us: _Count | None = None
    hw_thermal_slowdown_us: _Count | None = None
    hw_power_brake_slowdown_us: _Count | None = None
    sync_boost_us: _Count | None = None
    mig_devices: Annotated[list[MigDeviceIn], Field(max_length=MIG_SLICES_PER_GPU_MAX)] = []
    xid_errors: Annotated[list[XidCountIn], Field(max_length=XIDS_PER_GPU_MAX)] = []
    processes: Annotated[list[ProcessIn], Field(max_length=PROCESSES_PER_GPU_MAX)] = []
    attached_idle: Annotated[list[ContainerIn], Field(max_length=CONTAINERS_PER_GPU_MAX)] = []
    nvlink: Annotated[list[NvLinkIn], Field(max_length=NVLINKS_PER_GPU_MAX)] = []

    @field_validator("nvlink")
    @classmethod
    def _links_once(cls, links: list[NvLinkIn]) -> list[NvLinkIn]:
        if len({link.link for link in links}) != len(links):
            raise ValueError("an NVLink appears twice")
        return links

    def as_dict(self) -> dict:
        """model_dump()'s dict (gpu.Device.to_dict's keys) with only the nested models
        dumped, the plain fields as validated: the site makes one for each GPU of each
        snapshot it stores (kept: docs/performance.md)."""
        values = dict(self.__dict__)
        for name in gpu.NESTED_DEVICE_FIELDS:
            if values[name]:
                values[name] = [item.model_dump() for item in values[name]]
        return values


class DcgmIn(BaseModel):
    """DCGM on the node (gpu.dcgm.DcgmInfo): absent from an agent older than its detection."""

    model_config = _Strict
    installed: bool
    version: Annotated[str, Field(max_length=DRIVER_VERSION_MAX, pattern=_ONE_LINE)]
    problem: _Line


class FindingIn(BaseModel):
    model_config = _Strict
    code: _Code
    name: _Line
    status: Literal["ok", "warn", "fail"]
    message: _Text
    fix: _Text = ""


class Snapshot(BaseModel):
    model_config = _Strict
    schema_version: Literal[SNAPSHOT_SCHEMA_VERSION]  # type: ignore[valid-type]
    node: _Name
    collected_at: datetime
    present: bool
    driver_version: Annotated[str, Field(max_length=DRIVER_VERSION_MAX, pattern=_ONE_LINE)]
    devices: Annotated[list[DeviceIn], Field(max_length=GPUS_PER_NODE_MAX)]
    runtime_installed: bool
    toolkit_version: _Line
    cdi_spec_files: Annotated[
        list[Annotated[str, Field(max_length=CDI_SPEC_PATH_MAX, pattern=_ONE_LINE)]], Field(max_length=CDI_SPEC_FILES_MAX)
    ]
    cdi_devices: Annotated[list[_Line], Field(max_length=CDI_DEVICES_MAX)]
    attach: Literal["cdi", "legacy", "none"]
    findings: Annotated[list[FindingIn], Field(min_length=1, max_length=FINDINGS_MAX)]
    fixes_allowed: Annotated[list[_Code], Field(max_length=FIXES_ALLOWED_MAX)] = []
    dcgm: DcgmIn | None = None

    @field_validator("collected_at", mode="before")
    @classmethod
    def _iso_timestamp(cls, value: Any) -> datetime:
        # JSON carries timestamps as ISO strings; strict mode would refuse them.
        if not isinstance(value, str):
            raise ValueError("collected_at must be an ISO 8601 string")
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            raise ValueError("collected_at must carry a time zone")
        try:
            parsed = parsed.astimezone(UTC)
        except OverflowError:
            raise ValueError("collected_at is out of range") from None
        if parsed < OLDEST_SNAPSHOT:
            raise ValueError(f"collected_at {value[:40]!r} is before {OLDEST_SNAPSHOT:%Y}")
        return parsed

    @model_validator(mode="after")
    def _consistent(self) -> Snapshot:
        # Compared as claims name them: a slice with another GPU's UUID would let a
        # claim pinned by that UUID hold the wrong GPU.
        seen: set[str] = set()
        for uuid in (u for d in self.devices for u in (d.uuid, *(m.uuid for m in d.mig_devices))):
            if gpu.uuid_key(uuid) in seen:
                raise ValueError(f"the GPU or MIG UUID {uuid.strip()!r} appears twice (UUIDs compare trimmed, in any case)")
            seen.add(gpu.uuid_key(uuid))
        indexes = [d.index for d in self.devices]
        if len(set(indexes)) != len(indexes):
            raise ValueError("a GPU index appears twice")
        codes = [f.code for f in self.findings]
        if len(set(codes)) != len(codes):
            raise ValueError("a finding code appears twice")
        if centre := sorted(CENTRE_ONLY_CODES.intersection(codes)):
            raise PydanticCustomError(
                _CENTRE_ONLY, "finding {codes} is one only the site writes", {"codes": ", ".join(centre)}
            )
        if self.devices and not self.present:
            raise ValueError("devices listed although present is false")
        for key, _, per_node, what in DEVICE_LISTS:
            if (total := sum(len(getattr(d, key)) for d in self.devices)) > per_node:
                raise ValueError(f"{total} {what} on the node: a node may report at most {per_node}")
        return self



def parse_snapshot(data: Any) -> Snapshot:
    """Validate one snapshot: its JSON text as an agent sends it, or that text decoded
    (the ingest passes on the object of one it could not validate, to be refused with
    its node's name); one validated already is returned as it is."""
    if isinstance(data, Snapshot):
        return data
    if isinstance(data, str):
        # Text is validated as it is, by pydantic's own JSON parser: in half the time
        # json.loads and validating the objects take (manage.py bench's 8-GPU snapshot).
        # Text it refuses goes the way of an object below, for the reason that way
        # gives; the two accept the same snapshots (tests/fleet/test_hostile_input.py).
        try:
            return Snapshot.model_validate_json(data)
        except ValidationError:
            data = decode_snapshot(data)
    if not isinstance(data, dict):
        raise SnapshotError(f"snapshot must be a JSON object, not {type(data).__name__}")
    version = data.get("schema_version")
    if version != SNAPSHOT_SCHEMA_VERSION:
        reason = f"schema_version {repr(version)[:CODE_MAX]} is not read here: this site reads version {SNAPSHOT_SCHEMA_VERSION} only"
        if type(version) is int:
            reason += "; upgrade the agent" if version < SNAPSHOT_SCHEMA_VERSION else "; upgrade the site"
        raise SnapshotError(reason)
    try:
        return Snapshot.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'snapshot'}: {err['msg']}" for err in errors[:5]
        )
        error = CentreOnlyFinding if any(err["type"] == _CENTRE_ONLY for err in errors) else SnapshotError
        raise error(f"invalid snapshot: {problems}") from None
