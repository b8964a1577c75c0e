"""The audit log page: who changed what, newest first, optionally for one node."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.views.decorators.http import require_GET

from gpufleet.audit.models import AuditEntry
from gpufleet.core.access import VIEW, requires
from gpufleet.core.htmx import render_page
from gpufleet.core.querystring import clean_query

AUDIT_PER_PAGE = 50


@require_GET
@requires(VIEW)
def audit(request):
    entries = AuditEntry.objects.all()
    node = request.GET.get("node", "").strip()
    if node:
        entries = entries.filter(node_name=node)
    page = Paginator(entries, AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    context = {"page": page, "node_filter": node, "query": clean_query(request.GET)}
    return render_page(request, "audit/audit.html", context, partial="audit-table")

