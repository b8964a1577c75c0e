"""The fleet's placement answer ("where can N GPUs go now?") from the stored nodes and
their claims in force now.

The ranking and the reasons are the domain's (`gpufleet.gpu.place`, which asks each
node's ledger); this only loads every node with its current GPUs and claims in a
fixed number of queries, whatever the fleet size."""

from __future__ import annotations

from django.db.models import Prefetch
from django.utils import timezone

from gpufleet import gpu
from gpufleet.claims.models import Claim
from gpufleet.fleet.maintenance import in_maintenance_flag, in_validation_flag
from gpufleet.fleet.models import Device, FindingStatus, Node, offline_after

# The ruled-out list names this many nodes; the rest are only counted by reason.
RULED_OUT_SHOWN = 50


def fleet_placement(request: gpu.PlacementRequest, now=None) -> gpu.Placement:
    """Three queries: the nodes, their current GPUs, their claims."""
    now = now or timezone.now()
    stale_before = now - offline_after()
    nodes = Node.objects.annotate(in_maintenance=in_maintenance_flag(now), in_validation=in_validation_flag()).order_by(
        "name").prefetch_related(
        Prefetch(
            "devices",
            queryset=Device.objects.filter(vanished_at__isnull=True).order_by("index"),
            to_attr="current_devices_cache",
        ),
        Prefetch("claims", queryset=Claim.objects.in_force(now), to_attr="claims_in_force"),
    )
    candidates = (
        gpu.Candidate(
            name=node.name,
            ledger=node.ledger(claims=node.claims_in_force),
            offline=node.offline,
            maintenance=node.in_maintenance,
            validation=node.in_validation,
            failing=node.health == FindingStatus.FAIL,
            stale=node.last_seen < stale_before,
        )
        for node in nodes
    )
    return gpu.place(request, candidates)
