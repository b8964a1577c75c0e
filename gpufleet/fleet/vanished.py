"""Forgetting GPUs a node no longer reports. Such a GPU counts as lost capacity (and
fails its node) until it returns or someone forgets it here: taken out for good,
sent for repair. The admin site's GPU list offers this as an action."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from django.db import transaction

from gpufleet.audit.models import record
from gpufleet.fleet.models import Device, Node


def forget_vanished(devices: Iterable[Device], user) -> int:
    """Delete the vanished GPUs among `devices`, node by node under the node's lock (the
    lock ingest takes), bring the node's lost count down with them and write one audit
    row per node. A GPU its node still reports is kept: the next snapshot would bring it
    back anyway. Returns how many were forgotten."""
    asked: dict[int, list[int]] = defaultdict(list)
    for device in devices:
        asked[device.node_id].append(device.pk)
    forgotten = 0
    for node_id, pks in sorted(asked.items()):
        with transaction.atomic():
            node = Node.objects.select_for_update().filter(pk=node_id).first()
            if node is None:
                continue  # deleted meanwhile, its GPUs with it
            gone = list(node.devices.filter(pk__in=pks, vanished_at__isnull=False).order_by("index"))
            if not gone:
                continue
            Device.objects.filter(pk__in=[d.pk for d in gone]).delete()
            node.gpus_lost = node.devices.filter(vanished_at__isnull=False).count()
            node.save(update_fields=["gpus_lost"])
            record(
                user, "gpu.forget", node=node, target=", ".join(f"GPU {d.index}" for d in gone)[:200],
                before={"gpus": [{"index": d.index, "uuid": d.uuid, "name": d.name,
                                  "vanished_at": d.vanished_at.isoformat()} for d in gone]},
            )
            forgotten += len(gone)
    return forgotten
