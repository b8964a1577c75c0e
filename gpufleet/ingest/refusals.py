"""Counting what the ingest refuses, per node and per reason.

Anyone holding a broker credential can send messages that name any node, so a
refusal is counted, logged by its caller, and shown beside the node, but never
turns the node FAIL. The ingest calls `count_refusals` once a batch, after the
batch's transaction: a flood costs one UPDATE a batch, whatever its size."""

from __future__ import annotations

from collections import Counter

from django.db import models
from django.db.models.functions import Coalesce
from django.utils import timezone

from gpufleet.events import services as events
from gpufleet.fleet.models import Node, Refusal
from gpufleet.ingest.metrics import record_refusals


def count_refusals(counts: dict[tuple[str, str], int], now=None) -> None:
    """Add `counts`, keyed (node name, reason code), to the fleet's refusal counters
    (/metrics) and to the nodes named: one UPDATE whatever the batch, none when only
    unknown names were refused. An unknown name is counted fleet-wide only; no node
    is ever made for it. A reason that is no `Refusal` is a bug: ValueError."""
    by_reason: Counter[str] = Counter()
    per_node: dict[str, tuple[int, str]] = {}  # name -> (refused, the reason met last)
    for (name, reason), count in counts.items():
        reason = Refusal(reason).value
        if count <= 0:
            continue
        by_reason[reason] += count
        if reason != Refusal.UNKNOWN_NODE and isinstance(name, str) and name:
            per_node[name] = (per_node.get(name, (0, ""))[0] + count, reason)
    if by_reason:
        record_refusals(by_reason)
    if per_node:
        _count_on_nodes(per_node, now or timezone.now())
        events.record_refusals(counts, now or timezone.now())


def _count_on_nodes(per_node: dict[str, tuple[int, str]], now) -> None:
    names = sorted(per_node)
    # Each node's own figures through CASE, so the batch is one statement; a name
    # with no Node row matches nothing.
    added = models.Case(*(models.When(name=name, then=models.Value(per_node[name][0])) for name in names),
                        default=models.Value(0), output_field=models.BigIntegerField())
    reason = models.Case(*(models.When(name=name, then=models.Value(per_node[name][1])) for name in names),
                         default=models.F("refused_last_reason"), output_field=models.CharField())
    Node.objects.filter(name__in=names).update(
        refused_total=models.F("refused_total") + added,
        refused_last_reason=reason,
        refused_last_at=now,
        refused_since=Coalesce(models.F("refused_since"), models.Value(now, output_field=models.DateTimeField())),
    )
