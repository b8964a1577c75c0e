"""The fleet's pages: the overview, the node page, the doctor exports and /healthz. Views
stay thin: the querying lives in filters.py (overview filter), summary.py (tiles,
fleet findings), nodes.py (node page), reports.py (exports); who may do what is
asked of gpufleet.core.access only. The node page's claims panel and jobs are
drawn by the claims and jobs apps' template tags."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.db.models import F
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import SimpleLazyObject
from django.views.decorators.http import require_GET, require_POST

from gpufleet.core import downloads
from gpufleet.core.access import ACKNOWLEDGE_XID, MAINTAIN, RUN_DCGM_DIAG, VIEW, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.querystring import clean_query
from gpufleet.events import services as events
from gpufleet.fleet import charts, ingest_health, maintenance, reports
from gpufleet.fleet import nodes as node_page
from gpufleet.fleet import summary as fleet_summary
from gpufleet.fleet.filters import NodeFilter, paginate
from gpufleet.fleet.forms import MaintenanceForm
from gpufleet.fleet.models import Node
from gpufleet.fleet.xid_acks import NothingToAcknowledge, acknowledge_xids

# --- Fleet overview -----------------------------------------------------------


@require_GET
@requires(VIEW)
def fleet(request, partial: str = "node-table"):
    """The overview. HTMX asks for the table (filters, sort, page, refresh) at this
    URL and for the tiles and fleet findings at fleet:summary. An invalid filter
    value lists no node and is shown at its field and above the table, with 200
    so HTMX swaps it in."""
    now = timezone.now()
    # The tiles and findings are kept, not computed for each view (summary.kept); read
    # only when a template reads them: the table fragment never does.
    summary = SimpleLazyObject(fleet_summary.kept)
    # The table shows a node in maintenance or in validation as such (joins, no query of
    # their own); the driver select's versions come from the summary's scan of the fleet.
    nodes = Node.objects.annotate(maintenance_until=F("maintenance__until"), validation_level=F("validation__level"))
    node_filter = NodeFilter(request.GET, queryset=nodes, driver_versions=lambda: summary.driver_versions)
    query = clean_query(request.GET)
    summary_only = partial == "fleet-summary" and wants_fragment(request)
    context = {
        "filter": node_filter,
        "fragment": wants_fragment(request),
        "query": query,
        "table_url": _with_query(reverse("fleet:overview"), query),
        "page": None if summary_only else paginate(node_filter, request.GET.get("page")),
        "summary": summary,
        "now": now,
        "offline_alarm_percent": f"{settings.GPUFLEET_OFFLINE_ALARM_PERCENT:g}",
    }
    response = render_page(request, "fleet/fleet.html", context, partial=partial)
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
    a slow refresh) at fleet:node_findings."""
    node = get_object_or_404(Node.objects.select_related("maintenance__author", "validation__author"), name=name)
    now = timezone.now()
    context = {"node": node, "now": now, "findings": node_page.findings_worst_first(node)}
    if not (partial and wants_fragment(request)):
        node_page.load_for_page(node)
        context["history_range"] = node_page.history_range(request.GET)
        hours = charts.RANGES[context["history_range"]]
        context["devices"] = node_page.device_rows(node, node.ledger(at=now), now, hours)
        context["lost"] = node_page.lost_capacity(node)
        context["history_ranges"] = list(charts.RANGES)
        context["timeline"] = events.timeline(node.pk)
        context["maintenance"] = maintenance.of_loaded(node, now)
        context["maintenance_form"] = MaintenanceForm()
    return render_page(request, "fleet/node_detail.html", context, partial=partial)


@require_POST
@requires(ACKNOWLEDGE_XID)
def acknowledge_xid(request, name: str, index: int):
    """Clear GPU `index`'s Xid finding until a newer Xid, then back to the node page
    (a plain form post: the table, the findings and the header all change)."""
    node = get_object_or_404(Node, name=name)
    try:
        acknowledge_xids(node, index, request.user)
    except NothingToAcknowledge as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, f"Xid errors of GPU {index} acknowledged; a newer Xid will show again.")
    return redirect("fleet:node_detail", name=node.name)


@require_POST
@requires(MAINTAIN)
def set_maintenance(request, name: str):
    """Put the node in maintenance (or change the end and reason of the one it is
    in), then back to its page with what happened."""
    node = get_object_or_404(Node, name=name)
    form = MaintenanceForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{form.fields[f].label}: {' '.join(errs)}" for f, errs in form.errors.items())
        messages.error(request, f"Maintenance not set. {problems}")
        return redirect("fleet:node_detail", name=node.name)
    try:
        row = maintenance.start(node, form.cleaned_data["until"], form.cleaned_data["reason"], request.user,
                                validate_level=form.cleaned_data.get("validate"))
    except maintenance.MaintenanceError as exc:
        messages.error(request, f"Maintenance not set. {exc}")
    else:
        messages.success(request, f"{node.name} is in maintenance until {timezone.localtime(row.until):%Y-%m-%d %H:%M}.")
    return redirect("fleet:node_detail", name=node.name)


@require_POST
@requires(MAINTAIN)
def end_maintenance(request, name: str):
    node = get_object_or_404(Node, name=name)
    try:
        maintenance.end(node, request.user)
    except maintenance.MaintenanceError as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, f"Maintenance of {node.name} ended.")
    return redirect("fleet:node_detail", name=node.name)


@require_POST
@requires(RUN_DCGM_DIAG)
def end_validation(request, name: str):
    """Let a node in validation take claims again without a passing diagnostic: the
    admins' way out (DCGM broken, or the node judged fine otherwise), audited."""
    node = get_object_or_404(Node, name=name)
    try:
        maintenance.end_validation(node, request.user)
    except maintenance.MaintenanceError as exc:
        messages.warning(request, str(exc))
    else:
        messages.success(request, f"Validation of {node.name} ended: it takes claims again.")
    return redirect("fleet:node_detail", name=node.name)


# --- Exports -----------------------------------------------------------------


@require_GET
@requires(VIEW, tokens=True)
def node_report(request, name: str, fmt: str):
    only_problems = request.GET.get("only") == "problems"
    if fmt == "csv":
        node = get_object_or_404(Node.objects.only("name"), name=name)
        body = reports.csv_report(Node.objects.filter(pk=node.pk), only_problems)
        return downloads.download(body, fmt, f"gpufleet-{node.name}-doctor")
    node = get_object_or_404(reports.with_report_data(Node.objects.all()), name=name)
    report = reports.node_report(node, only_problems)
    if fmt == "json":
        body = reports.node_json(report)
    else:
        body = reports.node_markdown_doc(report, only_problems)
    return downloads.download(body, fmt, f"gpufleet-{node.name}-doctor")


@require_GET
@requires(VIEW, tokens=True)
def fleet_report(request, fmt: str):
    """The fleet's reports for exactly the nodes the overview's filters select,
    streamed. An invalid filter is a 400 naming it: a download quietly holding more
    nodes than were asked for would be taken for the filtered one."""
    node_filter = NodeFilter(request.GET, queryset=Node.objects.all())
    if not node_filter.is_valid():
        return _bad_filter(node_filter)
    only_problems = request.GET.get("only") == "problems"
    if fmt == "csv":
        return downloads.download(reports.csv_report(node_filter.qs, only_problems), fmt, "gpufleet-fleet-doctor")
    found = reports.fleet_reports(node_filter.qs, only_problems)
    if fmt == "json":
        body = reports.fleet_json(found)
    else:
        body = reports.fleet_markdown(found, only_problems=only_problems)
    return downloads.download(body, fmt, "gpufleet-fleet-doctor")


def _bad_filter(node_filter: NodeFilter) -> HttpResponse:
    lines = ["No report: these filter values are not valid.", *node_filter.error_messages()]
    return HttpResponseBadRequest("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")


# --- Health check ------------------------------------------------------------------


@login_not_required
def healthz(request):
    """For the site's monitor, no login: "ok", or 503 with the reason while the site
    receives no snapshots from its enrolled nodes (ingest_health, the beat's rule too)."""
    silence = ingest_health.ingest_silence()
    if silence is not None:
        return HttpResponse(silence.reason, status=503, content_type="text/plain; charset=utf-8")
    return HttpResponse("ok", content_type="text/plain")
