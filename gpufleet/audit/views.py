"""The audit log page: who changed what, newest first, optionally for one node or
one action."""

from __future__ import annotations

from django.views.decorators.http import require_GET

from gpufleet.audit.filters import AuditFilter
from gpufleet.audit.models import AuditEntry
from gpufleet.core.access import VIEW, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.paging import ListPaginator
from gpufleet.core.querystring import clean_query

AUDIT_PER_PAGE = 50


@require_GET
@requires(VIEW)
def audit(request):
    """An invalid filter value lists no entry and is shown at its field and above
    the table."""
    audit_filter = AuditFilter(request.GET, queryset=AuditEntry.objects.all())
    page = ListPaginator(audit_filter.qs, AUDIT_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "filter": audit_filter,
        "fragment": wants_fragment(request),
        "page": page,
        "node_filter": audit_filter.cleaned("node"),
        "query": clean_query(request.GET),
    }
    return render_page(request, "audit/audit.html", context, partial="audit-table")
