"""The claims' contribution to the overview's fleet findings."""

from __future__ import annotations

from gpufleet.claims.models import Claim
from gpufleet.fleet.models import Health
from gpufleet.fleet.summary import LIST_LIMIT, FleetFinding, Item


def missing_devices_finding() -> FleetFinding | None:
    flagged = Claim.objects.exclude(missing_devices=[])
    claims = list(
        flagged.select_related("node")
        .only("name", "missing_devices", "node__name")
        .order_by("node__name", "name")[: LIST_LIMIT + 1]
    )
    if not claims:
        return None
    items = [
        Item(f"{c.node.name}: claim “{c.name}” names {', '.join(c.missing_devices)}", node=c.node.name)
        for c in claims[:LIST_LIMIT]
    ]
    more = flagged.count() - LIST_LIMIT if len(claims) > LIST_LIMIT else 0
    title = "Claims name GPUs the node no longer has"
    return FleetFinding("missing_devices", Health.WARN, title, items, more)
