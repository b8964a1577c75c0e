"""Acknowledging a GPU's Xid errors: the admin has seen them, so the GPU's Xid
finding is cleared until a newer Xid arrives (the agent keeps reporting the
errors within its window, so the clearing has to be remembered centrally)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from django.db import transaction

from gpufleet import gpu
from gpufleet.audit.models import record
from gpufleet.fleet import summary_keep
from gpufleet.fleet.models import Finding, Node, XidAcknowledgement


def xid_finding_code(index: int) -> str:
    return f"gpu{index}.xid"


def cleared(finding: gpu.Finding, acknowledgement: XidAcknowledgement) -> gpu.Finding:
    who = acknowledgement.by.get_username() if acknowledgement.by else "someone"
    return replace(
        finding,
        status=gpu.Status.OK,
        message=f"Acknowledged by {who} at {acknowledgement.at:%Y-%m-%d %H:%M} UTC: {finding.message}",
        fix="",
    )


def acknowledgements(reports: Sequence[tuple[Node, Sequence[gpu.Finding], Sequence[gpu.Device]]]
                     ) -> dict[int, dict[str, XidAcknowledgement]]:
    """The Xid acknowledgements of a batch's nodes, by node pk and GPU UUID, for
    `apply_acknowledgements`: one query for the whole batch, and only when one of its
    snapshots has an Xid finding at all."""
    wanted = [node.pk for node, findings, devices in reports
              if {xid_finding_code(d.index) for d in devices} & {f.code for f in findings}]
    found: dict[int, dict[str, XidAcknowledgement]] = {}
    if wanted:
        for ack in XidAcknowledgement.objects.filter(node_id__in=wanted).select_related("by"):
            found.setdefault(ack.node_id, {})[ack.device_uuid] = ack
    return found


def apply_acknowledgements(findings: list[gpu.Finding], devices: Sequence[gpu.Device],
                           acks: dict[str, XidAcknowledgement]) -> list[gpu.Finding]:
    """`findings` with each acknowledged GPU's Xid finding cleared, unless a newer Xid
    came; `acks` are the node's, by GPU UUID (see `acknowledgements`)."""
    if not acks:
        return findings
    by_code = {xid_finding_code(d.index): d for d in devices}
    result = []
    for finding in findings:
        device = by_code.get(finding.code)
        ack = acks.get(device.uuid) if device else None
        if ack is not None and not gpu.newer_xids([x.to_dict() for x in device.xid_errors], ack.xid_errors):
            finding = cleared(finding, ack)
        result.append(finding)
    return result


class NothingToAcknowledge(Exception):
    pass


def acknowledge_xids(node: Node, index: int, user) -> Finding:
    """Clear GPU `index`'s Xid finding now and until a newer Xid; audited."""
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        device = locked.devices.filter(index=index, vanished_at__isnull=True).first()
        row = locked.findings.filter(code=xid_finding_code(index)).first()
        if device is None or row is None or not device.xid_errors or row.status == gpu.Status.OK:
            raise NothingToAcknowledge(f"GPU {index} of {locked.name} has no Xid errors to acknowledge")
        ack, _ = XidAcknowledgement.objects.update_or_create(
            node=locked, device_uuid=device.uuid, defaults={"xid_errors": device.xid_errors, "by": user}
        )
        finding = cleared(row.as_gpu_finding(), ack)
        row.status, row.message, row.fix = finding.status, finding.message, finding.fix
        row.save(update_fields=["status", "message", "fix"])
        locked.health = gpu.Status.worst(locked.findings.values_list("status", flat=True))
        locked.save(update_fields=["health"])
        record(user, "xid.acknowledge", node=locked, target=f"GPU {index} ({device.uuid})",
               after={"xid_errors": device.xid_errors})
        summary_keep.changed()
    return row

