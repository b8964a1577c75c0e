"""Storing one agent snapshot. One snapshot is one transaction with a fixed number
of SQL statements whatever the node's GPU count (see tests/ingest/test_ingest.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.fleet.xids import apply_acknowledgements
from gpufleet.jobs.models import JobStatus
from gpufleet.jobs.services import report_progress
from gpufleet.wire import Snapshot, SnapshotError, parse_snapshot

log = logging.getLogger(__name__)

# An agent clock this far ahead would pin the node: every later snapshot would
# look older than the stored one and be ignored.
MAX_CLOCK_SKEW = timedelta(minutes=5)

ACCEPTED, STALE, REJECTED = "accepted", "stale", "rejected"


@dataclass(frozen=True)
class IngestResult:
    outcome: str
    node: str = ""
    reason: str = ""


def ingest_snapshot(data, now=None) -> IngestResult:
    """Validate and store one snapshot. A malformed one is rejected with a logged
    reason and writes nothing; one not newer than the stored one is ignored."""
    now = now or timezone.now()
    try:
        snapshot = parse_snapshot(data)
        if snapshot.collected_at > now + MAX_CLOCK_SKEW:
            raise SnapshotError(f"collected_at {snapshot.collected_at.isoformat()} is in the future (agent clock?)")
    except SnapshotError as exc:
        name = data.get("node", "") if isinstance(data, dict) else ""
        name = name[:200] if isinstance(name, str) else ""
        reason = str(exc)[:_REASON_MAX]  # bounded: the input is the attacker's
        log.warning("rejected snapshot from node %r: %s", name, reason)
        _show_rejection(name, reason, now)
        return IngestResult(REJECTED, name, reason)

    with transaction.atomic():
        node = _locked_node(snapshot.node, now)
        if node.collected_at is not None and snapshot.collected_at <= node.collected_at:
            log.info("ignored snapshot from %s taken %s: not newer than the stored one", node, snapshot.collected_at)
            return IngestResult(STALE, node.name, "not newer than the stored snapshot")
        devices = _store_devices(node, snapshot, now)
        lost = list(node.devices.filter(vanished_at__isnull=False).order_by("index"))
        ledger = _flag_claims(node, devices)
        findings = _central_findings(node, snapshot, devices, lost, ledger)
        _store_findings(node, findings)
        _update_node(node, snapshot, devices, now)
        node.health = gpu.Status.worst(f.status for f in findings)
        node.problem = _problem(findings)
        node.gpu_models = ", ".join(sorted({d.name for d in devices}))[:500]
        node.gpus_lost = len(lost)
        node.gpus_reserved = ledger.reserved
        node.save()
    return IngestResult(ACCEPTED, node.name)


_REASON_MAX = 1000


def _show_rejection(name: str, reason: str, now) -> None:
    """A known node whose snapshot was rejected fails with the reason on its page,
    instead of silently going offline; its next good snapshot replaces the finding."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=name).first()
        if node is None:
            return  # an unknown name is no node's business
        Finding.objects.update_or_create(
            node=node,
            code="rejected-snapshot",
            defaults={
                "position": 0,
                "name": "Rejected snapshot",
                "status": gpu.Status.FAIL,
                "message": f"The site rejected this node's snapshot at {now:%Y-%m-%d %H:%M:%S} UTC: {reason}",
                "fix": "Upgrade the agent to the site's version; if it is current, report the reason as a bug.",
            },
        )
        node.health = gpu.Status.FAIL
        node.problem = f"Rejected snapshot: {reason}"[:300]
        node.save(update_fields=["health", "problem"])


def _locked_node(name: str, now) -> Node:
    # Insert-if-missing then lock: two first snapshots of one node cannot both create it.
    Node.objects.bulk_create([Node(name=name, first_seen=now, last_seen=now)], ignore_conflicts=True)
    return Node.objects.select_for_update().get(name=name)


def _store_devices(node: Node, snapshot: Snapshot, now) -> list[Device]:
    seen = [Device.from_reported(node, d.model_dump(), now) for d in snapshot.devices]
    # A GPU missing from this snapshot keeps its row, marked vanished.
    node.devices.filter(vanished_at__isnull=True).exclude(uuid__in=[d.uuid for d in seen]).update(vanished_at=now)
    if not seen:
        return []
    Device.objects.bulk_create(
        seen,
        update_conflicts=True,
        unique_fields=["node", "uuid"],
        update_fields=list(Device.UPDATED_ON_INGEST),
    )
    DeviceSample.objects.bulk_create(
        DeviceSample(
            device_id=d.pk,
            collected_at=snapshot.collected_at,
            vram_used_mib=d.vram_used_mib,
            utilization_percent=d.utilization_percent,
            temperature_c=d.temperature_c,
            power_draw_w=d.power_draw_w,
        )
        for d in seen
    )
    return seen


def _central_findings(
    node: Node, snapshot: Snapshot, devices: list[Device], lost: list[Device], ledger: gpu.Ledger
) -> list[gpu.Finding]:
    """The agent's findings as the centre keeps them: acknowledged Xids cleared, and
    what only the centre knows added: lost GPUs and overlapping claims."""
    reported = [gpu.Finding(f.code, f.name, f.status, f.message, f.fix) for f in snapshot.findings]
    findings = apply_acknowledgements(node, reported, devices)
    central = [_lost_capacity_finding(lost), _overlap_finding(ledger)]
    return findings + [f for f in central if f is not None]


def _problem(findings: list[gpu.Finding]) -> str:
    """The worst finding in words (the first of the worst, in the doctor's order)."""
    problems = [f for f in findings if f.status != gpu.Status.OK]
    if not problems:
        return ""
    worst = max(problems, key=lambda f: gpu.Status(f.status).rank)  # max keeps the first of equals
    text = f"{worst.name}: {worst.message}"
    more = len(problems) - 1
    suffix = f" (+{more} more)" if more else ""
    return text[: 300 - len(suffix) - 1] + "…" + suffix if len(text) + len(suffix) > 300 else text + suffix


def _overlap_finding(ledger: gpu.Ledger) -> gpu.Finding | None:
    overlaps = ledger.overlaps()
    if not overlaps:
        return None
    said = "; ".join(f"{claim.name!r}: {error}" for claim, error in overlaps[:10])
    return gpu.Finding(
        "claims-overlap",
        "Overlapping claims",
        gpu.Status.FAIL,
        f"Claims on this node no longer fit together: {said}",
        "Edit or delete one of the claims named; the ledger checks the rest when you save.",
    )


def _store_findings(node: Node, findings: list[gpu.Finding]) -> None:
    node.findings.all().delete()
    Finding.objects.bulk_create(
        Finding(node=node, position=i, code=f.code, name=f.name, status=f.status, message=f.message, fix=f.fix)
        for i, f in enumerate(findings)
    )


def _lost_capacity_finding(lost: list[Device]) -> gpu.Finding | None:
    """A GPU the node had and no longer reports fails the node: the agent cannot see
    it, so only the centre, which remembers it, can say so."""
    if not lost:
        return None
    gpus = "; ".join(f"GPU {d.index} {d.name} ({d.uuid}), last seen {d.last_seen:%Y-%m-%d %H:%M} UTC" for d in lost[:8])
    more = f" and {len(lost) - 8} more" if len(lost) > 8 else ""
    count = f"{len(lost)} GPU{'s' if len(lost) != 1 else ''}"
    return gpu.Finding(
        "lost-capacity",
        "Lost GPUs",
        gpu.Status.FAIL,
        f"{count} no longer reported by nvidia-smi: {gpus}{more}",
        "Check the node (nvidia-smi, dmesg for Xid 79). A GPU removed on purpose can be deleted"
        " from the node's devices in the admin site.",
    )


def _flag_claims(node: Node, devices: list[Device]) -> gpu.Ledger:
    """Mark claims that name devices the node no longer has; return the node's ledger."""
    claims = list(node.claims.order_by("created_at", "pk"))
    ledger = node.ledger(devices=devices, claims=claims)
    changed = []
    for claim in claims:
        missing = [i for i in claim.device_ids if ledger.resolve(i) is None]
        if missing != claim.missing_devices:
            claim.missing_devices = missing
            changed.append(claim)
    if changed:
        Claim.objects.bulk_update(changed, ["missing_devices"])
    return ledger


def _update_node(node: Node, snapshot: Snapshot, devices: list[Device], now) -> None:
    utilizations = [d.utilization_percent for d in devices if d.utilization_percent is not None]
    node.last_seen = now
    node.collected_at = snapshot.collected_at
    node.offline = False
    node.present = snapshot.present
    node.driver_version = snapshot.driver_version
    node.runtime_installed = snapshot.runtime_installed
    node.toolkit_version = snapshot.toolkit_version
    node.attach = snapshot.attach
    node.cdi_spec_files = list(snapshot.cdi_spec_files)
    node.cdi_devices = list(snapshot.cdi_devices)
    node.fixes_allowed = list(snapshot.fixes_allowed)
    node.gpu_count = len(devices)
    node.vram_total_mib = sum(d.vram_total_mib or 0 for d in devices)
    node.vram_used_mib = sum(d.vram_used_mib or 0 for d in devices)
    node.utilization_mean = sum(utilizations) / len(utilizations) if utilizations else None


def finish_diagnosis(job_id: int, result: IngestResult) -> bool:
    """Close the "diagnose now" job that this snapshot answers."""
    if result.outcome == ACCEPTED:
        return report_progress(job_id, JobStatus.DONE, "new snapshot stored")
    return report_progress(job_id, JobStatus.FAILED, error=f"snapshot {result.outcome}: {result.reason}")
