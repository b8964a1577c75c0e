"""The jobs' pages and actions: "diagnose now", "apply fix" (with its confirmation
step) and a job's status, which the node page polls while the job is open."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from gpufleet.agent.fixes import FIX_COMMANDS
from gpufleet.core.access import APPLY_FIX, DIAGNOSE, RUN_DCGM_DIAG, VIEW, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.fleet.models import Node
from gpufleet.gpu import dcgm
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import Job, JobStatus

FINDINGS_CHANGED = "findings-changed"


@require_POST
@requires(DIAGNOSE)
def node_diagnose(request, name: str):
    """Ask the node's agent to diagnose now; HTMX gets the polling job fragment,
    a plain form post goes back to the node page (which shows the job too)."""
    node = get_object_or_404(Node, name=name)
    job = jobs.request_diagnosis(node, request.user)
    return _job_response(request, job, f"Asked {node.name} to diagnose itself.")


@require_http_methods(["GET", "POST"])
@requires(APPLY_FIX)
def node_fix(request, name: str, code: str):
    """GET: the confirmation step (works without JavaScript; with it, the button's
    hx-confirm asks instead and posts straight here). POST: queue the fix."""
    node = get_object_or_404(Node, name=name)
    if code not in node.fixes_allowed:
        raise PermissionDenied(f"{node.name} does not allow remote fixes for “{code}”")
    finding = node.findings.filter(code=code).first()
    if request.method == "GET":
        context = {"node": node, "code": code, "finding": finding, "commands": FIX_COMMANDS.get(code, ())}
        return render_page(request, "jobs/fix_confirm.html", context)
    try:
        job = jobs.request_fix(node, code, request.user)
    except jobs.FixNotAllowed as exc:  # the node changed its mind since the check above
        raise PermissionDenied(str(exc)) from exc
    return _job_response(request, job, f"Asked {node.name} to apply the fix for “{code}”.")


@require_http_methods(["GET", "POST"])
@requires(RUN_DCGM_DIAG)
def node_dcgm_diag(request, name: str, level: int):
    """GET: the confirmation step (the node page asks for -r 2 here; -r 1 posts at once).
    POST: queue DCGM's diagnostic of `level` on the node. A node without DCGM says how to
    install it instead."""
    if level not in dcgm.LEVELS:
        raise Http404(f"no DCGM diagnostic of level {level} is offered")
    node = get_object_or_404(Node, name=name)
    context = {"node": node, "level": level, "argv": dcgm.diag_argv(level), "level_name": dcgm.LEVEL_NAMES[level],
               "install_hint": dcgm.INSTALL_HINT}
    if request.method == "GET":
        return render_page(request, "jobs/dcgm.html", context)
    try:
        job = jobs.request_dcgm_diag(node, level, request.user)
    except jobs.DiagnosticUnavailable as exc:
        if wants_fragment(request):
            return render_page(request, "jobs/dcgm.html", context | {"refusal": str(exc)}, partial="dcgm-refused")
        messages.error(request, f"No DCGM diagnostic was asked: {exc}. {dcgm.INSTALL_HINT}")
        return redirect("fleet:node_detail", name=node.name)
    return _job_response(request, job, f"Asked {node.name} to run DCGM's diagnostic -r {level}.")


def _job_response(request, job: Job, message: str):
    """The job as it stands: queued, or failed already when nothing could be sent."""
    if wants_fragment(request):
        return render_page(request, "jobs/job.html", {"job": job, "now": timezone.now()}, partial="job-status")
    if job.state == JobStatus.FAILED:
        messages.error(request, f"{job.get_kind_display()} on {job.node.name} failed: {job.error}.")
    else:
        messages.info(request, message)
    return redirect("fleet:node_detail", name=job.node.name)


@require_GET
@requires(VIEW)
def job_status(request, pk: int):
    """A job's status: the fragment polls itself every second while the job is open.
    When it is finished the response fires `findings-changed`, so the node page
    reloads its findings."""
    job = get_object_or_404(Job.objects.select_related("node", "requested_by"), pk=pk)
    response = render_page(request, "jobs/job.html", {"job": job, "now": timezone.now()}, partial="job-status")
    if job.finished and wants_fragment(request):
        trigger_client_event(response, FINDINGS_CHANGED)
    return response
