"""The dashboard's pages, fragments, actions and exports. Views stay thin: the
querying lives in filters.py (overview filter), summary.py (tiles, fleet
findings), nodes.py (node page), reports.py (exports); who may do what is
asked of access.py only."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from gpufleet.agent.fixes import FIX_COMMANDS
from gpufleet.audit.models import AuditEntry
from gpufleet.claims.views import claims_panel_context
from gpufleet.fleet.models import Node
from gpufleet.jobs import services as jobs
from gpufleet.jobs.models import Job
from gpufleet.web import nodes as node_page
from gpufleet.web import reports
from gpufleet.web.access import APPLY_FIX, DIAGNOSE, VIEW, requires
from gpufleet.web.filters import clean_query, filter_nodes, paginate
from gpufleet.web.htmx import render_page, wants_fragment
from gpufleet.web.summary import FleetSummary

AUDIT_PER_PAGE = 50

# --- Fleet overview -----------------------------------------------------------


@require_GET
@requires(VIEW)
def fleet(request, partial: str = "node-table"):
    """The overview. HTMX asks for the table (filters, sort, page, refresh) at this
    URL and for the tiles and fleet findings at web:fleet_summary."""
    form, nodes = filter_nodes(request.GET)
    query = clean_query(request.GET)
    summary_only = partial == "fleet-summary" and wants_fragment(request)
    context = {
        "form": form,
        "query": query,
        "table_url": _with_query(reverse("web:fleet"), query),
        "page": None if summary_only else paginate(nodes, form, request.GET.get("page")),
        # Queried only when a template reads it: the table fragment never does.
        "summary": FleetSummary(),
        "now": timezone.now(),
    }
    response = render_page(request, "web/fleet.html", context, partial=partial)
    if wants_fragment(request) and not summary_only and query != request.GET:
        # The filter form sends every field; push the short URL instead.
        response["HX-Push-Url"] = context["table_url"]
    return response


def _with_query(path: str, query) -> str:
    return f"{path}?{query.urlencode()}" if query else path


# --- Node page ---------------------------------------------------------------


@require_GET
@requires(VIEW)
def node_detail(request, name: str, partial: str | None = None):
    """The node page; HTMX asks for its findings (after a job finished, and on
    a slow refresh) at web:node_findings."""
    node = get_object_or_404(Node, name=name)
    now = timezone.now()
    context = {"node": node, "now": now, "findings": node_page.findings_worst_first(node)}
    if not (partial and wants_fragment(request)):
        claims = claims_panel_context(request, node)
        context.update(claims)
        context["devices"] = node_page.device_rows(node, claims.get("holder_by_index", {}), now)
        context["jobs"] = node_page.recent_jobs(node, now)
    return render_page(request, "web/node_detail.html", context, partial=partial)


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
        return render_page(request, "web/fix_confirm.html", context)
    try:
        job = jobs.request_fix(node, code, request.user)
    except jobs.FixNotAllowed as exc:  # the node changed its mind since the check above
        raise PermissionDenied(str(exc)) from exc
    return _job_response(request, job, f"Asked {node.name} to apply the fix for “{code}”.")


def _job_response(request, job: Job, message: str):
    if wants_fragment(request):
        return render_page(request, "web/job.html", {"job": job, "now": timezone.now()}, partial="job-status")
    messages.info(request, message)
    return redirect("web:node_detail", name=job.node.name)


@require_GET
@requires(VIEW)
def job_status(request, pk: int):
    """A job's status: the fragment polls itself every second while the job is open.
    When it is finished the response fires `findings-changed`, so the node page
    reloads its findings."""
    job = get_object_or_404(Job.objects.select_related("node", "requested_by"), pk=pk)
    response = render_page(request, "web/job.html", {"job": job, "now": timezone.now()}, partial="job-status")
    if job.finished and wants_fragment(request):
        response["HX-Trigger"] = "findings-changed"
    return response


# --- Exports -----------------------------------------------------------------


@require_GET
@requires(VIEW)
def node_report(request, name: str, fmt: str):
    node = get_object_or_404(reports.with_report_data(Node.objects.all()), name=name)
    only_problems = request.GET.get("only") == "problems"
    report = reports.node_report(node, only_problems)
    if fmt == "json":
        body = reports.node_json(report)
    elif fmt == "csv":
        body = reports.csv_rows([report])
    else:
        body = reports.node_markdown_doc(report, only_problems)
    return _download(body, fmt, f"gpufleet-{node.name}-doctor")


@require_GET
@requires(VIEW)
def fleet_report(request, fmt: str):
    """The fleet's reports for exactly the nodes the overview's filters select, streamed."""
    _form, nodes = filter_nodes(request.GET)
    only_problems = request.GET.get("only") == "problems"
    found = reports.fleet_reports(nodes, only_problems)
    if fmt == "json":
        body = reports.fleet_json(found)
    elif fmt == "csv":
        body = reports.csv_rows(found)
    else:
        body = reports.fleet_markdown(found, only_problems=only_problems)
    return _download(body, fmt, "gpufleet-fleet-doctor")


def _download(body, fmt: str, stem: str) -> StreamingHttpResponse:
    if fmt not in reports.FORMATS:
        raise Http404("unknown report format")
    response = StreamingHttpResponse(body, content_type=reports.FORMATS[fmt])
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="{stem}-{stamp}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response


# --- Audit log ---------------------------------------------------------------


@require_GET
@requires(VIEW)
def audit(request):
    entries = AuditEntry.objects.all()
    node = request.GET.get("node", "").strip()
    if node:
        entries = entries.filter(node_name=node)
    page = Paginator(entries, AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    context = {"page": page, "node_filter": node, "query": clean_query(request.GET)}
    return render_page(request, "web/audit.html", context, partial="audit-table")

