"""The bench's floors: the rows ingest writes, and the rows /report.csv reads, each
written or read the cheapest way, so that the bench can set ingest and the CSV export
beside them. Both are made from the site's own schema (ingest's row code, the models'
fields, the CSV's columns), never a copy of it, so they cannot drift from what they
are the floor of; tests/ingest/test_copy_floor.py and tests/fleet/test_reports.py hold
them equal."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from gpufleet import gpu
from gpufleet.core import bulk
from gpufleet.fleet import reports
from gpufleet.fleet.models import Device, DeviceSample, Finding, Node
from gpufleet.ingest import services
from gpufleet.ingest.schema import Snapshot

_FINDING_FIELDS = ("node_id", "position", "code", "name", "status", "message", "fix")


class CopyFloor:
    """The rows an accepted snapshot of a known node leaves (node updated, its GPUs
    upserted and those it no longer reports marked vanished, one sample per GPU, its
    findings replaced), built by ingest's own row code and written by its bulk writes
    (gpufleet/core/bulk.py: COPY into a staging table, then one set-based statement per
    table), one transaction per batch. No validation, locks, claims, Xid
    acknowledgements or comparing the findings first: a floor, not an ingest."""

    def __init__(self):
        self.rule = services.idle_rule()

    def store(self, snapshots: list[dict]) -> int:
        """Write one batch (snapshots of distinct, known nodes, as agents send them) in one
        transaction; returns the nodes updated."""
        now = timezone.now()
        with transaction.atomic():
            pks = dict(Node.objects.filter(name__any=[s["node"] for s in snapshots]).values_list("name", "pk"))
            nodes, device_rows, reported = [], [], []
            for data in snapshots:
                pk = pks[data["node"]]
                at = datetime.fromisoformat(data["collected_at"])
                snapshot = Snapshot.model_construct(**{**data, "collected_at": at})
                devices = []
                for each in data["devices"]:
                    device = gpu.Device.from_dict(each)
                    devices.append(device)
                    reported.append((pk, at, device))
                    device_rows.append(services._device_row(pk, each, now, at, at if self.rule.busy(device) else None))
                node = Node(pk=pk, name=data["node"])
                services._update_node(node, snapshot, tuple(devices), now)
                findings = [gpu.Finding(f["code"], f["name"], f["status"], f["message"], f.get("fix", ""))
                            for f in data["findings"]]
                node.health = gpu.Status.worst(f.status for f in findings)
                node.problem = services._problem(findings)
                node.gpu_models = ", ".join(sorted({d.name for d in devices}))[:500]
                node.gpus_lost = node.gpus_reserved = 0
                nodes.append((node, findings))
            stored = bulk.upsert(Device, services._DEVICE_FIELDS, device_rows, ["node", "uuid"],
                                 Device.UPDATED_ON_INGEST, keep_when_null=["busy_at"])
            Device.objects.filter(node_id__any=list(pks.values()), vanished_at__isnull=True).exclude(
                last_seen=now).update(vanished_at=now)
            bulk.insert(DeviceSample, ["device_id", "collected_at", *DeviceSample.MEASURES],
                        [(stored[pk, d.uuid][0], at, *(getattr(d, m) for m in DeviceSample.MEASURES))
                         for pk, at, d in reported])
            Finding.objects.filter(node_id__any=list(pks.values())).delete()
            bulk.insert(Finding, _FINDING_FIELDS, [(node.pk, i, f.code, f.name, str(f.status), f.message, f.fix)
                                                   for node, findings in nodes for i, f in enumerate(findings)])
            bulk.update(Node, [node for node, _ in nodes], services._NODE_FIELDS)
        return len(nodes)


# How the CSV writes a GPU's lists (gpufleet/fleet/reports.py _device_row), in SQL.
_CSV_LISTS = {
    "throttle_reasons": "(SELECT string_agg(t, ' ') FROM jsonb_array_elements_text(CASE jsonb_typeof("
                        "d.health->'throttle_reasons') WHEN 'array' THEN d.health->'throttle_reasons' END) t)",
    "xid_errors": "(SELECT string_agg((x->>'xid') || 'x' || (x->>'count'), ' ') FROM jsonb_array_elements("
                  "CASE jsonb_typeof(d.health->'xid_errors') WHEN 'array' THEN d.health->'xid_errors' END) x)",
    "processes": "CASE jsonb_typeof(d.health->'processes') WHEN 'array' THEN jsonb_array_length(d.health->'processes')"
                 " ELSE 0 END",
    "mig_devices": "(SELECT string_agg((m->>'profile') || ':' || (m->>'uuid'), ' ') FROM jsonb_array_elements("
                   "CASE jsonb_typeof(d.health->'mig_devices') WHEN 'array' THEN d.health->'mig_devices' END) m)",
    "nvlink": "(SELECT string_agg((n->>'link') || ':' || (n->>'state'), ' ') FROM jsonb_array_elements("
              "CASE jsonb_typeof(d.health->'nvlink') WHEN 'array' THEN d.health->'nvlink' END) n)",
}


def _device_cell(column: str) -> str:
    if column in _CSV_LISTS:
        return _CSV_LISTS[column]
    if column in Device.NOT_HEALTH:
        return f'd."{column}"'
    return f"d.health->>'{column}'"


def report_csv_copy() -> str:
    """PostgreSQL's own COPY ... TO STDOUT WITH CSV of the rows /report.csv writes
    (reports.CSV_COLUMNS): each node's findings, then its current GPUs with their
    health figures, nodes by name."""
    device_columns = reports.DEVICE_CSV_COLUMNS
    quoted = ", ".join(f'"{c}"' for c in reports.CSV_COLUMNS)
    no_device = ", ".join(f'NULL AS "{c}"' for c in device_columns)
    device = ", ".join(f'{_device_cell(c)} AS "{c}"' for c in device_columns)
    return (
        f"COPY (SELECT {quoted} FROM ("
        " SELECT n.name AS node, 0 AS kind, f.position AS pos, f.code, f.name, f.status, f.message, f.fix,"
        f" 'finding' AS \"row\", {no_device}"
        " FROM fleet_node n JOIN fleet_finding f ON f.node_id = n.id"
        " UNION ALL"
        " SELECT n.name, 1, d.\"index\", 'gpu' || d.\"index\", d.name, '', '', '', 'device',"
        f" {device}"
        " FROM fleet_node n JOIN fleet_device d ON d.node_id = n.id AND d.vanished_at IS NULL"
        ") AS report_rows ORDER BY node, kind, pos) TO STDOUT WITH (FORMAT csv, HEADER)"
    )
