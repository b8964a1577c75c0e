"""The fleet's placement answer ("where can N GPUs go now?") from the stored nodes and
their claims in force now.

The ranking and the reasons are the domain's (`gpufleet.gpu.place`, which asks each
node's ledger); this only loads every node with its current GPUs and claims in a
fixed number of queries, whatever the fleet size."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Prefetch, QuerySet
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
    return gpu.place(request, fleet_candidates(Claim.objects.in_force(now), now))


def fleet_candidates(claims: QuerySet[Claim], now: datetime, nodes: QuerySet[Node] | None = None) -> Iterator[gpu.Candidate]:
    """Every node (or those of `nodes`) as the domain's Candidate, its ledger holding
    `claims` of the node, in three queries: the nodes, their current GPUs, their claims."""
    stale_before = now - offline_after()
    nodes = _flagged(Node.objects.all() if nodes is None else nodes, now).order_by("name").prefetch_related(
        Prefetch(
            "devices",
            queryset=Device.objects.filter(vanished_at__isnull=True).order_by("index"),
            to_attr="current_devices_cache",
        ),
        Prefetch("claims", queryset=claims, to_attr="claims_chosen"),
    )
    return (
        gpu.Candidate(
            name=node.name,
            ledger=node.ledger(claims=node.claims_chosen),
            offline=node.offline,
            maintenance=node.in_maintenance,
            validation=node.in_validation,
            failing=node.health == FindingStatus.FAIL,
            stale=node.last_seen < stale_before,
        )
        for node in nodes
    )


def _flagged(nodes: QuerySet[Node], now: datetime) -> QuerySet[Node]:
    return nodes.annotate(in_maintenance=in_maintenance_flag(now), in_validation=in_validation_flag())


def open_nodes(now: datetime) -> QuerySet[Node]:
    """The nodes that take new work, in SQL: those whose Candidate (as fleet_candidates
    makes it) is not `closed()`, so a caller can count them without reading each one."""
    return _flagged(Node.objects.all(), now).filter(
        offline=False, in_maintenance=False, in_validation=False, last_seen__gte=now - offline_after(),
    ).exclude(health=FindingStatus.FAIL)
