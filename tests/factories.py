"""Snapshots made the way an agent makes them: the real diagnosis over an
in-memory host (fake nvidia-smi/nvidia-ctk output and Docker facts)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

from gpufleet import gpu
from gpufleet.fleet.models import Node
from gpufleet.ingest.services import ingest_snapshot
from gpufleet.wire import build_snapshot
from tests.fakes.memory import FakeDocker, host
from tests.fakes.recorded import H200_UUIDS


def gpu_uuid(node: str, index: int) -> str:
    if node == "h200" and index < len(H200_UUIDS):
        return H200_UUIDS[index]
    digest = hashlib.sha1(f"{node}/{index}".encode()).hexdigest()[:12]
    return f"GPU-{index:08x}-0000-0000-0000-{digest}"


def smi_rows(node: str, gpus: int, used_mib: int = 1024, total_mib: int = 143771, util: str = "35",
             driver: str = "570.133.20", name: str = "NVIDIA H200") -> str:
    return "".join(
        f"{i}, {gpu_uuid(node, i)}, {name}, {total_mib}, {used_mib}, {util}, {driver}\n" for i in range(gpus)
    )


def diagnosis(node: str = "alpha", gpus: int = 8, attach: str = "legacy", toolkit: str | None = "1.18.2",
              **smi) -> gpu.HostDiagnosis:
    runtimes = ("runc", "nvidia") if attach in ("legacy", "cdi") else ("runc",)
    cdi = tuple(f"nvidia.com/gpu={i}" for i in range(gpus)) if attach == "cdi" else ()
    runner = host(
        smi=smi_rows(node, gpus, **smi) if gpus else None,
        ctk=f"NVIDIA Container Toolkit CLI version {toolkit}\ncommit: 9e88ed3\n" if toolkit else None,
    )
    return gpu.diagnose_host(runner, FakeDocker(gpu.DockerInfo(runtimes=runtimes, cdi_devices=cdi)), [])


def snapshot(node: str = "alpha", gpus: int = 8, at: datetime | None = None, fixes=(), **kwargs) -> dict:
    """A valid snapshot dict; `at` defaults to now (UTC)."""
    return build_snapshot(diagnosis(node, gpus, **kwargs), node, list(fixes), at or datetime.now(UTC))


def later(snap: dict, seconds: float = 30) -> datetime:
    return datetime.fromisoformat(snap["collected_at"]) + timedelta(seconds=seconds)


def ingest(name: str, gpus: int = 2, at: datetime | None = None, **kwargs):
    """Ingest one node's snapshot through the real path; returns the stored Node."""
    result = ingest_snapshot(snapshot(name, gpus, at=at, **kwargs))
    assert result.outcome == "accepted", result
    return Node.objects.get(name=name)


def hx(**headers) -> dict:
    """Headers of an HTMX request (as the test client takes them)."""
    return {"HTTP_HX_REQUEST": "true", **{f"HTTP_{k.upper()}": v for k, v in headers.items()}}


def agent_entry(payload, job_id: int | None = None, *, node: str | None = None, key=None,
                kind: str | None = None) -> dict[bytes, bytes]:
    """The ingest stream entry a node's agent appends (as gpufleet.agent.tasks.send_to_centre
    does): for a snapshot (a dict, or its text) [text, job_id], else `payload` as given
    (kind "progress"); signed with `key`, by default the node's own (the node enrolled)."""
    from gpufleet import wire
    from gpufleet.fleet import credentials

    if kind is None:
        kind = wire.SNAPSHOT if isinstance(payload, (dict, str)) else wire.PROGRESS
    if kind == wire.SNAPSHOT:
        node = node or (payload["node"] if isinstance(payload, dict) else wire.decode_snapshot(payload)["node"])
        payload = [payload if isinstance(payload, str) else wire.encode_snapshot(payload), job_id]
    return wire.encode_entry(key or credentials.enroll(node), node, kind, payload)


def ingest_entry(payload, job_id: int | None = None, **options) -> str:
    """`agent_entry(...)` handled by the ingest consumer's code, here; its outcome."""
    from gpufleet.ingest import stream

    return stream.ingest_entries([agent_entry(payload, job_id, **options)])[0]
