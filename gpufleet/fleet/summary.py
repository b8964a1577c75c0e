"""Fleet-wide figures for the overview: the tiles and the fleet-level findings.

Each part is one or a few aggregate queries whatever the fleet size. The overview reads
them through `kept()`: computed at most once per GPUFLEET_SUMMARY_MAX_AGE_S and shared by
every view and poll (summary_keep.py), and only when a template reads them (the table
fragment never does)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Case, Count, Exists, F, Min, OuterRef, Q, Sum, Value, When
from django.db.models.functions import Greatest, StrIndex, Substr
from django.utils import timezone

from gpufleet import gpu
from gpufleet.fleet import summary_keep
from gpufleet.fleet.maintenance import in_maintenance_flag
from gpufleet.fleet.models import Device, Finding, FindingStatus, Health, Maintenance, Node

# How many nodes, GPUs or claims a fleet finding names before it says "and N more".
LIST_LIMIT = 10

_ONLINE = Q(offline=False)
# A node in maintenance was taken out of service on purpose: it is counted apart, not
# as failing or offline (`away` is annotated by _nodes()).
_HERE = Q(away=False)

# A finding's kind, whatever GPU it is about: "gpu3.xid" -> "xid", "lost:0000:9B:00.0" -> "lost".
_KIND = Case(
    When(code__regex=r"^gpu[0-9]+\.", then=Substr("code", StrIndex("code", Value(".")) + 1)),
    When(code__contains=":", then=Substr("code", 1, StrIndex("code", Value(":")) - 1)),
    default=F("code"),
)
# Kinds about one GPU each, counted in GPUs; the rest are about the node.
_GPU_KINDS = {"xid": "Xid errors", "ecc": "memory (ECC) errors", "thermal": "thermal slowdown",
              "power": "power brake slowdown", "lost": "GPU fallen off the bus"}
_XID = re.compile(r"\bXid (\d+)\b")


def toolkit_short(version: str) -> str:
    """"NVIDIA Container Toolkit CLI version 1.18.2" -> "1.18.2"; other text as is."""
    match = re.search(r"\bversion\s+(\S+)", version or "")
    return match.group(1) if match else (version or "")


@dataclass(frozen=True)
class Item:
    """One line under a fleet finding; `node` links to its page, `query` to the filtered
    table, `url` to another page (another app's finding)."""

    text: str
    node: str = ""
    query: str = ""
    url: str = ""
    when: datetime | None = None
    status: Health | None = None
    fix: str = ""


@dataclass(frozen=True)
class FleetFinding:
    code: str
    status: Health
    title: str
    items: list[Item] = field(default_factory=list)
    more: int = 0
    # The overview's query string listing all of them, for "and N more".
    more_query: str = ""


@dataclass(frozen=True)
class Figures:
    """The summary as plain data, as kept and shared between views: `as_of` is when it
    was computed."""

    as_of: datetime
    tiles: dict
    findings: list[FleetFinding]
    driver_versions: list[str]


def kept() -> Figures:
    """The fleet's summary, computed at most GPUFLEET_SUMMARY_MAX_AGE_S ago."""
    return summary_keep.get_or_compute(lambda: FleetSummary().figures())


class FleetSummary:
    """Lazily computed: `tiles`, `findings`, `driver_versions`, or all as `figures()`."""

    def __init__(self, now: datetime | None = None):
        self.now = now or timezone.now()

    def figures(self) -> Figures:
        return Figures(self.now, self.tiles, self.findings, self.driver_versions)

    def _nodes(self):
        return Node.objects.annotate(away=in_maintenance_flag(self.now))

    @cached_property
    def _groups(self) -> list[dict]:
        """The fleet's figures by node state and versions: the one scan of the nodes that
        the tiles, both drift findings and the driver filter's options are summed from
        (a handful of rows: a fleet runs few versions)."""
        return list(
            self._nodes()
            .values("offline", "away", "health", "present", "driver_version", "toolkit_version")
            .annotate(nodes=Count("pk"), gpus=Sum("gpu_count"), vram_total=Sum("vram_total_mib"),
                      vram_used=Sum("vram_used_mib"), reserved=Sum("gpus_reserved"),
                      free=Sum(Greatest(Node.FREE, Value(0))), lost=Sum("gpus_lost"))
            .order_by()
        )

    @cached_property
    def driver_versions(self) -> list[str]:
        """Every driver version the fleet runs (offline nodes too), for the driver filter."""
        return sorted({g["driver_version"] for g in self._groups if g["driver_version"]})

    @cached_property
    def tiles(self) -> dict:
        groups = self._groups
        online = [g for g in groups if not g["offline"]]
        here = [g for g in online if not g["away"]]

        def total(rows, key="nodes"):
            return sum(g[key] for g in rows)

        figures = {
            "nodes": total(groups),
            "nodes_offline": total(g for g in groups if g["offline"]),
            "not_reporting": total(g for g in groups if g["offline"] and not g["away"]),
            "maintenance": total(g for g in groups if g["away"]),
            "gpus": total(online, "gpus"),
            "vram_total": total(online, "vram_total"),
            "vram_used": total(online, "vram_used"),
            "reserved": total(online, "reserved"),
            # Only GPUs a claim could put to use: "find a node" rules out offline, in-maintenance
            # and failing nodes (gpufleet/gpu/placement.py), so "GPUs free" leaves them out too.
            "free": total((g for g in here if g["health"] != Health.FAIL), "free"),
            "lost": total(groups, "lost"),
            "failing": total(g for g in here if g["health"] == Health.FAIL),
            "warning": total(g for g in here if g["health"] == Health.WARN),
        }
        figures["online"] = figures["nodes"] - figures["nodes_offline"]
        # Nodes that stopped reporting (not in maintenance) are a problem like failing
        # ones; above GPUFLEET_OFFLINE_ALARM_PERCENT of the fleet, the loudest one.
        nodes, offline = figures["nodes"], figures["not_reporting"]
        figures["offline_percent"] = round(100 * offline / nodes) if nodes else 0
        figures["offline_alarm"] = bool(offline) and 100 * offline > settings.GPUFLEET_OFFLINE_ALARM_PERCENT * nodes
        return figures

    @cached_property
    def findings(self) -> list[FleetFinding]:
        offline = self._offline()
        found = [
            self._problems(Health.FAIL, "failing"),
            self._problems(Health.WARN, "with warnings"),
            offline,
            self._causes(),
            self._drift("driver_version", "driver", "Driver versions differ across nodes"),
            self._drift("toolkit_version", "", "Container toolkit versions differ across nodes", toolkit_short),
            self._vanished(),
        ]
        if offline is not None and self.tiles["offline_alarm"]:
            found.remove(offline)
            found.insert(0, offline)
        return [f for f in found if f is not None]

    def _problems(self, health: Health, words: str) -> FleetFinding | None:
        """Online nodes of one health, each with its worst finding in words."""
        count = self.tiles["failing" if health == Health.FAIL else "warning"]
        if not count:
            return None
        nodes = (self._nodes().filter(_ONLINE, _HERE, health=health).order_by("name")
                 .only("name", "problem", "health")[:LIST_LIMIT])
        items = [Item(f"{n.name}: {n.problem or n.get_health_display()}", node=n.name) for n in nodes]
        title = f"{count} node{'s' if count != 1 else ''} {words}"
        return FleetFinding(f"nodes_{health}", health, title, items, max(0, count - len(items)),
                            urlencode({"health": health.value}))

    def _offline(self) -> FleetFinding | None:
        tiles = self.tiles
        count = tiles["not_reporting"]
        if not count:
            return None
        nodes = (self._nodes().filter(_HERE, offline=True).order_by("-last_seen")
                 .only("name", "last_seen")[:LIST_LIMIT])
        items = [Item(n.name, node=n.name, when=n.last_seen) for n in nodes]
        title = f"{count} node{'s' if count != 1 else ''} stopped reporting"
        if tiles["offline_alarm"]:
            title += f": {tiles['offline_percent']}% of the fleet"
        return FleetFinding("offline", Health.FAIL, title, items, max(0, count - len(items)),
                            urlencode({"offline": "yes"}))

    def _causes(self) -> FleetFinding | None:
        """The warn and fail findings of online nodes (not in maintenance) grouped by
        cause, one line each with its fix: one aggregate query whatever the fleet size.
        A cause is a finding's kind (whatever GPU it names), status and fix, so two Xids
        with different remedies are two causes."""
        rows = list(
            # The status test is the partial index's condition, so only problem rows are read.
            # NOT EXISTS, not a left join's IS NULL: the database misjudges how many nodes
            # such a join leaves once the maintenance table has rows, and then reads every
            # node's findings one node at a time.
            Finding.objects.filter(status__in=[FindingStatus.WARN, FindingStatus.FAIL], node__offline=False)
            .filter(~Exists(Maintenance.objects.filter(node=OuterRef("node"), until__gt=self.now)))
            .annotate(kind=_KIND)
            .values("kind", "status", "fix")
            .annotate(gpus=Count("pk"), nodes=Count("node", distinct=True), messages=Count("message", distinct=True),
                      message=Min("message"), name=Min("name"), node_name=Min("node__name"))
            .order_by()
        )
        if not rows:
            return None
        rows.sort(key=lambda r: (-FindingStatus(r["status"]).rank, -r["nodes"], -r["gpus"], r["kind"]))
        items = [
            Item(_cause_text(row), node=row["node_name"] if row["nodes"] == 1 else "",
                 status=Health(row["status"]), fix=row["fix"])
            for row in rows[:LIST_LIMIT]
        ]
        worst = Health.FAIL if any(r["status"] == FindingStatus.FAIL for r in rows) else Health.WARN
        return FleetFinding("causes", worst, "Problems by cause", items, max(0, len(rows) - LIST_LIMIT))

    @cached_property
    def _versions(self) -> list[dict]:
        """Online nodes by driver and toolkit version, for both drift findings. Online
        only: what an offline node reported last may be long out of date."""
        counts: dict[tuple[str, str], int] = {}
        for g in self._groups:
            if not g["offline"] and g["present"]:
                key = (g["driver_version"], g["toolkit_version"])
                counts[key] = counts.get(key, 0) + g["nodes"]
        return [{"driver_version": d, "toolkit_version": t, "n": n} for (d, t), n in counts.items()]

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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _cause_text(row: dict) -> str:
    """"Xid 79 on 3 GPUs of 2 nodes", "12 nodes: No nvidia runtime in Docker"."""
    kind, same = row["kind"], row["messages"] == 1
    if kind in _GPU_KINDS:
        what = _GPU_KINDS[kind]
        if kind == "xid":
            what = _xid_named(row["message"], row["fix"]) or what
        elif same:
            what = row["message"]
        return f"{what} on {_plural(row['gpus'], 'GPU')} of {_plural(row['nodes'], 'node')}"
    return f"{_plural(row['nodes'], 'node')}: {row['message'] if same else row['name']}"


def _xid_named(message: str, fix: str) -> str:
    """The Xid whose remedy is the group's fix, as "Xid 79"; "" when none says so."""
    for number in _XID.findall(message or ""):
        if gpu.xid_code(int(number)).action == fix:
            return f"Xid {number}"
    return ""
