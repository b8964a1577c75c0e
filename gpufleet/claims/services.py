"""Changing claims. Every change is checked by the ledger against the node's
other claims inside one transaction that holds the node row locked, so two
admins saving at once cannot double-book a GPU; every change is audited."""

from __future__ import annotations

from django.db import transaction

from gpufleet import gpu
from gpufleet.audit.models import record
from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Node


class ClaimRejected(Exception):
    """The ledger refused the claim; `error` carries the machine code and sentence."""

    def __init__(self, error: gpu.FitError):
        super().__init__(str(error))
        self.error = error


def ledger_for(node: Node, excluding: Claim | None = None) -> gpu.Ledger:
    """The node's ledger built from its current devices and claims, optionally
    leaving out the claim being edited (an edit is checked against the others)."""
    claims = node.claims.all()
    if excluding is not None and excluding.pk:
        claims = claims.exclude(pk=excluding.pk)
    return gpu.Ledger(node.gpu_info(), [c.as_gpu_claim() for c in claims])


def check_claim(node: Node, proposed: gpu.Claim, editing: Claim | None = None) -> gpu.FitError | None:
    """Would `proposed` fit now? For inline validation; `save_claim` checks again under lock."""
    return ledger_for(node, excluding=editing).fit(proposed)


def save_claim(node: Node, proposed: gpu.Claim, user, editing: Claim | None = None) -> Claim:
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=node.pk)
        if editing is not None:
            editing = Claim.objects.get(pk=editing.pk, node=locked)
        error = check_claim(locked, proposed, editing)
        if error is not None:
            raise ClaimRejected(error)
        before = editing.as_audit_dict() if editing is not None else None
        claim = editing or Claim(node=locked, created_by=user if user and user.is_authenticated else None)
        claim.name = proposed.name
        claim.count = proposed.count if not proposed.device_ids else 0
        claim.device_ids = list(proposed.device_ids)
        claim.missing_devices = []
        claim.save()
        _store_reserved(locked)
        action = "claim.update" if before is not None else "claim.create"
        record(user, action, node=locked, target=claim.name, before=before, after=claim.as_audit_dict())
    return claim


def delete_claim(claim: Claim, user) -> None:
    with transaction.atomic():
        locked = Node.objects.select_for_update().get(pk=claim.node_id)
        claim = Claim.objects.get(pk=claim.pk, node=locked)
        before = claim.as_audit_dict()
        claim.delete()
        _store_reserved(locked)
        record(user, "claim.delete", node=locked, target=before["name"], before=before)


def _store_reserved(node: Node) -> None:
    node.gpus_reserved = ledger_for(node).reserved
    node.save(update_fields=["gpus_reserved"])
