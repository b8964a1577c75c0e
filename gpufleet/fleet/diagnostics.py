"""A node's DCGM diagnostics as the fleet keeps them: the last run that produced results
is the node's (`Node.diagnostic`), and while it did not pass it is a finding of the node:
written here at once when the run ends, and by ingest at every snapshot after that
(gpu.dcgm.finding), until a run passes. A passing run also ends the node's validation."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Max

from gpufleet import gpu
from gpufleet.fleet import maintenance, summary_keep
from gpufleet.fleet.models import Finding, Node
from gpufleet.gpu import dcgm
from gpufleet.gpu.diagnosis import problem_text


def summary_of(result: dcgm.DiagResult, job_id: int, finished_at: datetime) -> dict:
    """What the node keeps of a run (Node.diagnostic)."""
    return {"job": job_id, "level": result.level, "verdict": str(result.verdict), "summary": result.summary(),
            "at": finished_at.isoformat()}


def record_run(node_id: int, job_id: int, result: dcgm.DiagResult, finished_at: datetime) -> None:
    """A DCGM diagnostic of the node finished with results: it is the node's last one, its
    finding (or none, for a pass) replaces the one before, and the node's health and
    problem follow. A run without results (dcgmi could not run) changes none of that."""
    if not result.tests:
        return
    summary = summary_of(result, job_id, finished_at)
    with transaction.atomic():
        # Locked as ingest locks it: a snapshot stored meanwhile would rewrite health.
        node = Node.objects.select_for_update().get(pk=node_id)
        node.diagnostic = summary
        Finding.objects.filter(node=node, code=dcgm.FINDING_CODE).delete()
        found = dcgm.finding(summary)
        if found is not None:
            last = Finding.objects.filter(node=node).aggregate(last=Max("position"))["last"]
            Finding.objects.create(node=node, position=(last if last is not None else -1) + 1, code=found.code,
                                   name=found.name, status=str(found.status), message=found.message, fix=found.fix)
        findings = [gpu.Finding(f.code, f.name, f.status, f.message, f.fix)
                    for f in Finding.objects.filter(node=node).order_by("position")]
        node.health = gpu.Status.worst(f.status for f in findings)
        node.problem = problem_text(findings)
        node.save(update_fields=["diagnostic", "health", "problem"])
        summary_keep.changed()
    if result.verdict in (dcgm.Verdict.PASS, dcgm.Verdict.WARN) and result.level is not None:
        maintenance.validated_by(node_id, result.level, finished_at, job_id)
