"""Plain functions turning rows into the JSON the API returns. Times are ISO 8601."""

from __future__ import annotations

from datetime import datetime

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.events.models import Event
from gpufleet.fleet.models import Device, Finding, Node


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def node_summary(node: Node) -> dict:
    """One node as listed: the figures kept on the node row, no joins."""
    return {
        "name": node.name,
        "status": node.status.value,
        "health": node.health,
        "gpu_count": node.gpu_count,
        "vram_total_mib": node.vram_total_mib,
        "vram_used_mib": node.vram_used_mib,
        "gpus_reserved": node.gpus_reserved,
        "gpus_free": node.gpus_free,
        # GPUs the node had and no longer reports, and its worst finding in words.
        "gpus_lost": node.gpus_lost,
        "problem": node.problem,
        "driver_version": node.driver_version,
        "toolkit_version": node.toolkit_version,
        "attach": node.attach,
        "last_seen": _time(node.last_seen),
        "collected_at": _time(node.collected_at),
    }


def node_detail(
    node: Node, devices: list[Device], findings: list[Finding], claims: list[Claim], ledger: gpu.Ledger
) -> dict:
    return {
        **node_summary(node),
        "present": node.present,
        "runtime_installed": node.runtime_installed,
        "cdi_spec_files": list(node.cdi_spec_files),
        "cdi_devices": list(node.cdi_devices),
        "utilization_mean": node.utilization_mean,
        "first_seen": _time(node.first_seen),
        "ledger": ledger_summary(ledger),
        "devices": [device(d, ledger) for d in devices],
        "findings": [finding(f) for f in findings],
        "claims": [claim(c) for c in claims],
    }


def ledger_summary(ledger: gpu.Ledger) -> dict:
    return {"total": ledger.total, "reserved": ledger.reserved, "free": ledger.free, "holders": ledger.holders}


def device(d: Device, ledger: gpu.Ledger) -> dict:
    """A GPU; `holder` is the claim pinning it (or taking every GPU), vanished GPUs have none."""
    return {
        **d.as_gpu_device().to_dict(),
        "last_seen": _time(d.last_seen),
        "vanished_at": _time(d.vanished_at),
        "holder": None if d.vanished else ledger.holder_of(d.index),
    }


def finding(f: Finding) -> dict:
    return f.as_gpu_finding().to_dict()


def event(e: Event) -> dict:
    """An event. Needs e.node loaded."""
    return {
        "id": e.pk,
        "kind": e.kind,
        "severity": e.severity,
        "node": e.node.name if e.node_id else None,
        "gpu_index": e.gpu_index,
        "pci_bus_id": e.pci_bus_id,
        "code": e.code,
        "message": e.message,
        "opened_at": _time(e.opened_at),
        "closed_at": _time(e.closed_at),
        "muted": e.muted,
    }


def claim(c: Claim) -> dict:
    """A claim; `mode` is count, all or devices. Needs c.node, c.created_by, c.owner and c.team loaded."""
    return {
        "id": c.pk,
        "node": c.node.name,
        "name": c.name,
        "mode": c.mode,
        "count": c.count,
        "device_ids": list(c.device_ids),
        "missing_devices": list(c.missing_devices),
        "created_by": c.created_by.get_username() if c.created_by else None,
        "owner": c.owner.get_username() if c.owner else None,
        "team": c.team.name if c.team else None,
        "contact": c.contact,
        "starts_at": _time(c.starts_at),
        "ends_at": _time(c.ends_at),
        "in_force": c.in_force(),
        "ended": c.ended,
        "series": str(c.series) if c.series else None,
        "created_at": _time(c.created_at),
        "updated_at": _time(c.updated_at),
        "quota_override_reason": c.quota_override_reason,
    }
