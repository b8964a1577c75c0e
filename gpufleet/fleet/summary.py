"""Fleet-wide figures for the overview: the tiles and the fleet-level findings.

Each part is one or a few aggregate queries whatever the fleet size, computed
only when a template reads it (the table fragment never does)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from urllib.parse import urlencode

from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest

from gpufleet.fleet.models import Device, Health, Node

# How many nodes, GPUs or claims a fleet finding names before it says "and N more".
LIST_LIMIT = 10

_ONLINE = Q(offline=False)
# Nodes whose free GPUs a claim could put to use: "find a node" rules out offline and
# failing ones (gpufleet/gpu/placement.py), so "GPUs free" leaves them out too.
_TAKES_WORK = _ONLINE & ~Q(health=Health.FAIL)


def toolkit_short(version: str) -> str:
    """"NVIDIA Container Toolkit CLI version 1.18.2" -> "1.18.2"; other text as is."""
    match = re.search(r"\bversion\s+(\S+)", version or "")
    return match.group(1) if match else (version or "")


@dataclass(frozen=True)
class Item:
    """One line under a fleet finding; `node` links to its page, `query` to the filtered table."""

    text: str
    node: str = ""
    query: str = ""
    when: datetime | None = None


@dataclass(frozen=True)
class FleetFinding:
    code: str
    status: Health
    title: str
    items: list[Item] = field(default_factory=list)
    more: int = 0


class FleetSummary:
    """Lazily computed: templates read `tiles` and `findings`."""

    @cached_property
    def tiles(self) -> dict:
        figures = Node.objects.aggregate(
            nodes=Count("pk"),
            nodes_offline=Count("pk", filter=Q(offline=True)),
            gpus=Coalesce(Sum("gpu_count", filter=_ONLINE), 0),
            vram_total=Coalesce(Sum("vram_total_mib", filter=_ONLINE), 0),
            vram_used=Coalesce(Sum("vram_used_mib", filter=_ONLINE), 0),
            reserved=Coalesce(Sum("gpus_reserved", filter=_ONLINE), 0),
            free=Coalesce(Sum(Greatest(F("gpu_count") - F("gpus_reserved"), Value(0)), filter=_TAKES_WORK), 0),
            lost=Coalesce(Sum("gpus_lost"), 0),
            failing=Count("pk", filter=_ONLINE & Q(health=Health.FAIL)),
            warning=Count("pk", filter=_ONLINE & Q(health=Health.WARN)),
        )
        figures["online"] = figures["nodes"] - figures["nodes_offline"]
        return figures

    @cached_property
    def findings(self) -> list[FleetFinding]:
        found = [
            self._problems(Health.FAIL, "failing"),
            self._problems(Health.WARN, "with warnings"),
            self._offline(),
            self._drift("driver_version", "driver", "Driver versions differ across nodes"),
            self._drift("toolkit_version", "", "Container toolkit versions differ across nodes", toolkit_short),
            self._vanished(),
        ]
        return [f for f in found if f is not None]

    def _problems(self, health: Health, words: str) -> FleetFinding | None:
        """Online nodes of one health, each with its worst finding in words."""
        count = self.tiles["failing" if health == Health.FAIL else "warning"]
        if not count:
            return None
        nodes = Node.objects.filter(_ONLINE, health=health).order_by("name").only("name", "problem", "health")[:LIST_LIMIT]
        items = [Item(f"{n.name}: {n.problem or n.get_health_display()}", node=n.name) for n in nodes]
        title = f"{count} node{'s' if count != 1 else ''} {words}"
        return FleetFinding(f"nodes_{health}", health, title, items, max(0, count - len(items)))

    def _offline(self) -> FleetFinding | None:
        count = self.tiles["nodes_offline"]
        if not count:
            return None
        nodes = Node.objects.filter(offline=True).order_by("-last_seen").only("name", "last_seen")[:LIST_LIMIT]
        items = [Item(n.name, node=n.name, when=n.last_seen) for n in nodes]
        title = f"{count} node{'s' if count != 1 else ''} stopped reporting"
        return FleetFinding("offline", Health.FAIL, title, items, max(0, count - len(items)))

    @cached_property
    def _versions(self) -> list[dict]:
        """Online nodes by driver and toolkit version: one scan for both drift findings
        (a handful of rows: a fleet runs few versions). Online only: what an offline
        node reported last may be long out of date."""
        return list(
            Node.objects.filter(_ONLINE, present=True)
            .values("driver_version", "toolkit_version")
            .annotate(n=Count("pk"))
            .order_by()
        )

    def _drift(self, column: str, param: str, title: str, shorten=str) -> FleetFinding | None:
        counts: dict[str, int] = {}
        for row in self._versions:
            if row[column]:
                counts[row[column]] = counts.get(row[column], 0) + row["n"]
        if len(counts) < 2:
            return None
        versions = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        items = [
            Item(f"{shorten(version)} on {n} node{'s' if n != 1 else ''}",
                 query=urlencode({param: version}) if param else "")
            for version, n in versions[:LIST_LIMIT]
        ]
        return FleetFinding(f"{param or 'toolkit'}_drift", Health.WARN, title, items, max(0, len(versions) - LIST_LIMIT))

    def _vanished(self) -> FleetFinding | None:
        vanished = Device.objects.filter(vanished_at__isnull=False)
        devices = list(
            vanished.select_related("node")
            .only("index", "uuid", "name", "vanished_at", "node__name")
            .order_by("-vanished_at")[: LIST_LIMIT + 1]
        )
        if not devices:
            return None
        items = [
            Item(f"{d.node.name}: GPU {d.index} {d.name} ({d.uuid})", node=d.node.name, when=d.vanished_at)
            for d in devices[:LIST_LIMIT]
        ]
        more = vanished.count() - LIST_LIMIT if len(devices) > LIST_LIMIT else 0
        title = "GPUs vanished (no longer reported by their node)"
        return FleetFinding("vanished", Health.FAIL, title, items, more)
