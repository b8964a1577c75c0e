"""Storing agent snapshots. A batch of snapshots is one transaction with a fixed
number of SQL statements whatever its size and the nodes' GPU counts (see
tests/ingest/test_batches.py); one snapshot is a batch of one."""

from __future__ import annotations

import logging
import operator
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import F
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.core import bulk
from gpufleet.events import services as events
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node, XidAcknowledgement
from gpufleet.fleet.xid_acks import acknowledgements, apply_acknowledgements
from gpufleet.gpu import accounting, dcgm
from gpufleet.gpu.diagnosis import problem_text
from gpufleet.ingest.refusals import count_refusals
from gpufleet.ingest.schema import DeviceIn, Snapshot, parse_snapshot
from gpufleet.jobs.models import JobStatus
from gpufleet.jobs.services import report_progress
from gpufleet.usage import record as usage
from gpufleet.wire import SnapshotError

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
    """Validate and store one snapshot: a batch of one (see `ingest_snapshots`)."""
    return ingest_snapshots([data], now)[0]


def ingest_snapshots(datas: list, now=None) -> list[IngestResult]:
    """Validate and store a batch of snapshots; one result per snapshot, in order.

    Each snapshot keeps the guarantees it has alone: it is validated alone (a
    malformed one is rejected with its logged reason, counted as refused and writes
    nothing else), one not newer than the stored one (or than another of its node in
    the batch) is ignored (the caller counts those: it knows which are replays), and
    each is stored whole or not at all. The batch is written in one transaction whose
    statement count does not grow with the batch size or the GPU count
    (tests/ingest/test_batches.py). If the database refuses the batch, each
    snapshot is tried again in its own transaction, so only the refused one is
    rejected. Transient errors (OperationalError, InterfaceError: the database
    restarting) are raised for the caller to retry: nothing is lost or rejected."""
    now = now or timezone.now()
    results: list[IngestResult | None] = [None] * len(datas)
    rejected: dict[str, tuple[int, str]] = {}  # node -> (position, reason) of its last rejection
    newest: dict[str, tuple[int, Snapshot]] = {}
    superseded: list[tuple[int, str]] = []  # (position, node) of those a newer one in the batch replaced
    refused: Counter[tuple[str, str]] = Counter()  # (node, Refusal code) of the invalid ones
    for position, data in enumerate(datas):
        try:
            snapshot = _validated(data, now)
        except SnapshotError as exc:
            name = data.node if isinstance(data, Snapshot) else data.get("node", "") if isinstance(data, dict) else ""
            name = name[:200] if isinstance(name, str) else ""
            reason = str(exc)[:_REASON_MAX]  # bounded: the input is the attacker's
            log.warning("rejected snapshot from node %r: %s", name, reason)
            results[position] = IngestResult(REJECTED, name, reason)
            rejected[name] = (position, reason)
            refused[name, exc.refusal] += 1
            continue
        kept = newest.get(snapshot.node)
        if kept is not None and snapshot.collected_at <= kept[1].collected_at:
            superseded.append((position, snapshot.node))
            continue
        if kept is not None:
            superseded.append((kept[0], snapshot.node))
        newest[snapshot.node] = (position, snapshot)

    batch = sorted(newest.values(), key=lambda item: item[1].node)
    if batch:
        try:
            with transaction.atomic():
                stored = _store_batch([snapshot for _, snapshot in batch], now)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError as exc:
            log.warning("the database refused a batch of %d snapshots (%s); storing them one by one", len(batch), exc)
            stored = {}
            for _, snapshot in batch:
                try:
                    with transaction.atomic():
                        stored |= _store_batch([snapshot], now)
                except (OperationalError, InterfaceError):
                    raise
                except DatabaseError as one:
                    reason = f"the database refused it: {one}"[:_REASON_MAX]
                    log.warning("rejected snapshot from node %r: %s", snapshot.node, reason)
                    stored[snapshot.node] = IngestResult(REJECTED, snapshot.node, reason)
        for position, snapshot in batch:
            results[position] = stored[snapshot.node]
            if stored[snapshot.node].outcome == REJECTED:
                rejected[snapshot.node] = (position, stored[snapshot.node].reason)
    for position, name in superseded:
        # Stale when the newer one stored or was itself stale; where the database
        # refused the newer one, the older one was not stored either: say so.
        newer = results[newest[name][0]]
        if newer.outcome == REJECTED:
            results[position] = IngestResult(REJECTED, name, "a newer snapshot of this node in the same batch was refused")
        else:
            results[position] = IngestResult(STALE, name, "a newer snapshot of this node came in the same batch")

    # A rejection shows on its node unless a snapshot of that node stored after it
    # (later in the batch) already says something newer.
    shown = [
        (name, reason) for name, (position, reason) in rejected.items()
        if name and not (name in newest and newest[name][0] > position and results[newest[name][0]].outcome == ACCEPTED)
    ]
    if shown:
        _show_rejections(shown, now)
    if refused:
        count_refusals(dict(refused), now)
    return results  # type: ignore[return-value]


def _validated(data, now) -> Snapshot:
    snapshot = parse_snapshot(data)
    if snapshot.collected_at > now + MAX_CLOCK_SKEW:
        raise SnapshotError(f"collected_at {snapshot.collected_at.isoformat()} is in the future (agent clock?)")
    return snapshot


def _store_batch(snapshots: list[Snapshot], now) -> dict[str, IngestResult]:
    """Store snapshots of distinct nodes (sorted by name), inside the caller's transaction,
    with a fixed number of set-based statements."""
    nodes = _locked_nodes([s.node for s in snapshots], now)
    results, fresh = {}, []
    for snapshot in snapshots:
        node = nodes[snapshot.node]
        if node.collected_at is not None and snapshot.collected_at <= node.collected_at:
            log.info("ignored snapshot from %s taken %s: not newer than the stored one", node, snapshot.collected_at)
            results[node.name] = IngestResult(STALE, node.name, "not newer than the stored snapshot")
        else:
            fresh.append((node, snapshot))
            results[node.name] = IngestResult(ACCEPTED, node.name)
    if not fresh:
        return results
    gpus, idle_since = _store_devices(fresh, now)
    lost = _lost_devices([node for node, _ in fresh])
    claims = _claims([node for node, _ in fresh], now)
    acks = acknowledgements([(node, snapshot.findings, gpus[node.pk]) for node, snapshot in fresh])
    all_findings, changed_claims, used = [], [], []
    rule = idle_rule()
    for node, snapshot in fresh:
        covered = usage.covered(node.collected_at, snapshot.collected_at)
        # The node as this snapshot reports it, before its ledger is made from it.
        _update_node(node, snapshot, gpus[node.pk], now)
        ledger = node.ledger(gpus=gpus[node.pk], claims=claims[node.pk])
        idle = accounting.idle_claims(ledger, idle_since[node.pk], [c.starts_at for c in claims[node.pk]],
                                      snapshot.collected_at - timedelta(hours=rule.hours), rule,
                                      booked=[c.made_ahead for c in claims[node.pk]], at=snapshot.collected_at)
        changed = _flag_claims(ledger, claims[node.pk], idle)
        changed_claims += changed
        holders = [usage.Holder(c.pk, c.name, c.owner_name or "", c.team_name or "") for c in claims[node.pk]]
        used += usage.rows(node.pk, node.name, snapshot.collected_at, holders,
                           accounting.account(ledger, covered, rule))
        findings = _central_findings(snapshot, gpus[node.pk], lost[node.pk], ledger, idle, rule, acks.get(node.pk, {}),
                                     node.diagnostic)
        all_findings.append((node, findings))
        node.health = gpu.Status.worst(f.status for f in findings)
        node.problem = _problem(findings)
        node.gpu_models = ", ".join(sorted({d.name for d in gpus[node.pk]}))[:500]
        node.gpus_lost = len(lost[node.pk])
        node.gpus_reserved = ledger.reserved
        node.gpus_busy_unclaimed = ledger.busy_unclaimed
    if changed_claims:
        Claim.objects.bulk_update(changed_claims, ["missing_devices", "idle_since"])
    _store_findings(all_findings)
    usage.add(used)
    events.record_snapshots([(node, each, gpus[node.pk], lost[node.pk]) for node, each in all_findings], now)
    bulk.update(Node, [node for node, _ in fresh], _NODE_FIELDS)
    return results


_REASON_MAX = 1000


UPGRADE_FIX = "Upgrade the agent to the site's version; if it is current, report the reason as a bug."


def _show_rejections(rejections: list[tuple[str, str]], now) -> None:
    """A known node whose snapshot was rejected fails with the reason on its page,
    instead of silently going offline; its next good snapshot replaces the finding."""
    reasons = dict(rejections)
    with transaction.atomic():
        nodes = list(Node.objects.select_for_update().filter(name__in=sorted(reasons)).order_by("name"))
        if not nodes:
            return  # an unknown name is no node's business
        Finding.objects.bulk_create(
            [
                Finding(
                    node=node,
                    code="rejected-snapshot",
                    position=0,
                    name="Rejected snapshot",
                    status=gpu.Status.FAIL,
                    message=f"The site rejected this node's snapshot at {now:%Y-%m-%d %H:%M:%S} UTC: {reasons[node.name]}",
                    fix=UPGRADE_FIX,
                )
                for node in nodes
            ],
            update_conflicts=True,
            unique_fields=["node", "code"],
            update_fields=["position", "name", "status", "message", "fix"],
        )
        for node in nodes:
            node.health = gpu.Status.FAIL
            node.problem = f"Rejected snapshot: {reasons[node.name]}"[:300]
        Node.objects.bulk_update(nodes, ["health", "problem"])


def _locked_nodes(names: list[str], now) -> dict[str, Node]:
    # Locked in name order, so two batches cannot deadlock. A node's first snapshot
    # creates it with insert-if-missing, so two first snapshots cannot both create it.
    nodes = _locking(names)
    if missing := [name for name in names if name not in nodes]:
        Node.objects.bulk_create([Node(name=name, first_seen=now, last_seen=now) for name in missing],
                                 ignore_conflicts=True)
        nodes |= _locking(missing)
    return nodes


def _locking(names: list[str]) -> dict[str, Node]:
    # Only what is read before a snapshot rewrites the rest (_NODE_FIELDS, bulk.update): the
    # last DCGM diagnostic (its finding), and DCGM as known (kept when an older agent says
    # nothing of it). A deferred field read later would be a query inside bulk.update's COPY.
    locked = (Node.objects.select_for_update().filter(name__any=names)
              .only("name", "collected_at", "diagnostic", "dcgm").order_by("name"))
    return {node.name: node for node in locked}


def _store_devices(
    fresh: list[tuple[Node, Snapshot]], now
) -> tuple[dict[int, tuple[gpu.Device, ...]], dict[int, dict[int, datetime]]]:
    """Store the reported GPUs of each node and one sample of each; return, for each node,
    its GPUs as the domain has them (by index) and since when each did no work (by
    index). The rows go to the database as tuples: a model instance made for each GPU
    was an eighth of the work of storing an 8-GPU snapshot (5.11 -> 4.47 million
    instructions, README "What moved ingest")."""
    rule = idle_rule()
    gpus, rows, made = {}, [], []
    for node, snapshot in fresh:
        at = snapshot.collected_at
        devices = []
        for reported in map(DeviceIn.as_dict, snapshot.devices):
            device = gpu.Device.from_dict(reported)
            devices.append(device)
            made.append((node.pk, at, device))
            # A GPU new to the centre is first seen at this snapshot; one it knows keeps its
            # first_seen, and its busy_at where this snapshot shows no work (the upsert keeps both).
            rows.append(_device_row(node.pk, reported, now, at, at if rule.busy(device) else None))
        gpus[node.pk] = tuple(sorted(devices, key=operator.attrgetter("index")))
    stored = bulk.upsert(Device, _DEVICE_FIELDS, rows, ["node", "uuid"], Device.UPDATED_ON_INGEST,
                         keep_when_null=["busy_at"], returning=["first_seen", "busy_at"])
    # A GPU missing from its snapshot keeps its row, marked vanished: every reported
    # one was just stamped last_seen=now, so the others of these nodes are the missing.
    Device.objects.filter(node_id__any=list(gpus), vanished_at__isnull=True).exclude(last_seen=now).update(vanished_at=now)
    samples, idle_since = [], {pk: {} for pk in gpus}
    for node_pk, at, device in made:
        pk, first_seen, busy_at = stored[node_pk, device.uuid]
        samples.append((pk, at, device.vram_used_mib, device.utilization_percent, device.temperature_c,
                        device.power_draw_w))
        idle_since[node_pk][device.index] = Device.idle_since(busy_at, first_seen)
    bulk.insert(DeviceSample, ["device_id", "collected_at", *DeviceSample.MEASURES], samples)
    return gpus, idle_since


# The GPU columns each accepted snapshot writes, in the order of _device_row's values.
_DEVICE_FIELDS = ["node_id", *Device.COLUMNS, "pci_bus_id", "health", "last_seen", "vanished_at", "first_seen",
                  "busy_at"]
_device_columns = operator.itemgetter(*Device.COLUMNS)


def _device_row(node_pk: int, reported: dict, now, first_seen, busy_at) -> tuple:
    """One GPU's row as its snapshot reports it (gpu.Device.to_dict's keys), seen `now`
    (see _DEVICE_FIELDS)."""
    health = dict(reported)
    for key in Device.NOT_HEALTH:
        del health[key]
    return (node_pk, *_device_columns(reported), reported["pci_bus_id"] or "", health, now, None, first_seen, busy_at)


def idle_rule() -> gpu.IdleRule:
    return gpu.IdleRule(util_percent=settings.GPUFLEET_IDLE_UTIL_PERCENT, hours=settings.GPUFLEET_IDLE_HOURS,
                        no_show_hours=settings.GPUFLEET_NO_SHOW_HOURS or None)


def _lost_devices(nodes: list[Node]) -> dict[int, list[Device]]:
    lost: dict[int, list[Device]] = {node.pk: [] for node in nodes}
    for device in Device.objects.filter(node_id__any=list(lost), vanished_at__isnull=False).order_by("node_id", "index"):
        lost[device.node_id].append(device)
    return lost


def _claims(nodes: list[Node], now) -> dict[int, list[Claim]]:
    """The nodes' claims in force now: a booking ahead holds nothing yet, an ended claim nothing more."""
    claims: dict[int, list[Claim]] = {node.pk: [] for node in nodes}
    in_order = Claim.objects.filter(node_id__any=list(claims)).in_force(now).order_by("created_at", "pk")
    # The owner's and team's names as they are now, which the usage rows keep.
    for claim in in_order.annotate(owner_name=F("owner__username"), team_name=F("team__name")):
        claims[claim.node_id].append(claim)
    return claims


def _central_findings(
    snapshot: Snapshot, devices: tuple[gpu.Device, ...], lost: list[Device], ledger: gpu.Ledger,
    idle: list[tuple[gpu.Claim, tuple[int, ...], datetime]], rule: gpu.IdleRule, acks: dict[str, XidAcknowledgement], diagnostic: dict | None = None,
) -> list[gpu.Finding]:
    """The agent's findings as the centre keeps them: acknowledged Xids cleared, and
    what only the centre knows added: lost GPUs, overlapping claims, claims against the
    work found on the GPUs, and the node's last DCGM diagnostic when it did not pass."""
    reported = [gpu.Finding(f.code, f.name, f.status, f.message, f.fix) for f in snapshot.findings]
    findings = apply_acknowledgements(reported, devices, acks)
    central = [_lost_capacity_finding(lost), _overlap_finding(ledger), dcgm.finding(diagnostic)]
    return findings + [f for f in central if f is not None] + gpu.claim_use_findings(ledger, idle, rule)


def _problem(findings: list[gpu.Finding]) -> str:
    """The worst finding in words (the first of the worst, in the doctor's order)."""
    return problem_text(findings)


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


def _store_findings(findings: list[tuple[Node, list[gpu.Finding]]]) -> None:
    """Each node's findings replaced by its snapshot's: its stored ones deleted, the new
    ones inserted, whether or not they changed (docs/performance.md: comparing them first
    was no faster)."""
    Finding.objects.filter(node_id__any=[node.pk for node, _ in findings]).delete()
    bulk.insert(Finding, ["node_id", "position", "code", "name", "status", "message", "fix"],
                [(node.pk, i, f.code, f.name, str(f.status), f.message, f.fix)
                 for node, each in findings for i, f in enumerate(each)])


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


def _flag_claims(
    ledger: gpu.Ledger, claims: list[Claim], idle: list[tuple[gpu.Claim, tuple[int, ...], datetime]]
) -> list[Claim]:
    """The node's claims whose flags changed, for the caller to save: missing_devices
    (ids the node no longer has) and idle_since (since when the claim did no work, while
    that is longer than the idle rule's hours: accounting.idle_claims)."""
    idle_since = {claim.name.lower(): since for claim, _, since in idle}
    changed = []
    for claim in claims:
        missing = [i for i in claim.device_ids if ledger.resolve(i) is None]
        since = idle_since.get(claim.name.lower())
        if missing != claim.missing_devices or since != claim.idle_since:
            claim.missing_devices, claim.idle_since = missing, since
            changed.append(claim)
    return changed


# The node columns each accepted snapshot rewrites.
_NODE_FIELDS = [
    "last_seen", "collected_at", "offline", "present", "driver_version", "runtime_installed", "toolkit_version",
    "attach", "cdi_spec_files", "cdi_devices", "fixes_allowed", "dcgm", "gpu_count", "vram_total_mib", "vram_used_mib",
    "utilization_mean", "health", "problem", "gpu_models", "gpus_lost", "gpus_reserved",
    "gpus_busy_unclaimed",
]


def _update_node(node: Node, snapshot: Snapshot, devices: tuple[gpu.Device, ...], now) -> None:
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
    if snapshot.dcgm is not None:  # an older agent says nothing of DCGM: what is known stays
        node.dcgm = snapshot.dcgm.model_dump()
    node.gpu_count = len(devices)
    node.vram_total_mib = sum(d.vram_total_mib or 0 for d in devices)
    node.vram_used_mib = sum(d.vram_used_mib or 0 for d in devices)
    node.utilization_mean = sum(utilizations) / len(utilizations) if utilizations else None


def finish_diagnosis(job_id: int, result: IngestResult, node: str | None = None) -> bool:
    """Close the "diagnose now" job that this snapshot answers, if it is a job of
    `node` (the snapshot's signer; None: any node's job)."""
    if result.outcome == ACCEPTED:
        return report_progress(job_id, JobStatus.DONE, "new snapshot stored", node=node)
    if result.outcome == STALE:
        # A newer snapshot of the node (taken after this one, so after the request)
        # is stored: that answers "diagnose now" too. With batched ingest the agent's
        # next scheduled snapshot often lands in the same batch as the job's.
        return report_progress(job_id, JobStatus.DONE, "a newer snapshot of the node is stored", node=node)
    return report_progress(job_id, JobStatus.FAILED, error=f"snapshot {result.outcome}: {result.reason}", node=node)
