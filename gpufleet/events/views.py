"""The Events page (open first, then the newest), its CSV/JSON export through the same
filters, and the open events count of the navigation."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.http import require_GET

from gpufleet.core import downloads
from gpufleet.core.access import VIEW, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.paging import ListPaginator
from gpufleet.core.querystring import clean_query
from gpufleet.events import services
from gpufleet.events.filters import EventFilter, listed
from gpufleet.events.models import Event

EVENTS_PER_PAGE = 50
COLUMNS = ["id", "kind", "severity", "node", "gpu_index", "pci_bus_id", "code", "name", "message_opened", "message",
           "opened_at", "closed_at", "count", "claim_name", "job", "muted"]


@require_GET
@requires(VIEW)
def events(request: HttpRequest) -> HttpResponse:
    """An invalid filter value lists no event and is shown at its field and above the table."""
    event_filter = EventFilter(request.GET, queryset=listed())
    page = ListPaginator(event_filter.qs, EVENTS_PER_PAGE).get_page(request.GET.get("page"))
    query = clean_query(request.GET)
    exported = query.copy()
    exported.pop("page", None)
    context = {
        "filter": event_filter,
        "fragment": wants_fragment(request),
        "page": page,
        "query": query,
        "export_query": exported.urlencode(),
    }
    return render_page(request, "events/events.html", context, partial="events-table")


@require_GET
@requires(VIEW, tokens=True)
def events_export(request: HttpRequest, fmt: str) -> HttpResponse:
    """Every event the page's filters select, in its order, streamed. An invalid filter
    is a 400: a download holding more than was asked would mislead."""
    event_filter = EventFilter(request.GET, queryset=listed())
    if not event_filter.is_valid():
        lines = ["No export: these filter values are not valid.", *event_filter.error_messages()]
        return HttpResponseBadRequest("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")
    found = (row(event) for event in event_filter.qs.iterator(chunk_size=2000))
    if fmt == "json":
        body = _json(found)
    else:
        body = downloads.csv_stream(COLUMNS, ([each[column] for column in COLUMNS] for each in found))
    return downloads.download(body, fmt, "gpufleet-events")


def row(event: Event) -> dict:
    """An event as the export has it (times in ISO 8601, UTC)."""
    return {
        "id": event.pk,
        "kind": event.kind,
        "severity": event.severity,
        "node": event.node.name if event.node_id else None,
        "gpu_index": event.gpu_index,
        "pci_bus_id": event.pci_bus_id,
        "code": event.code,
        "name": event.name,
        "message_opened": event.message_opened,
        "message": event.message,
        "opened_at": event.opened_at.isoformat() if event.opened_at else None,
        "closed_at": event.closed_at.isoformat() if event.closed_at else None,
        "count": event.count,
        "claim_name": event.claim_name,
        "job": event.job_id,
        "muted": event.muted,
    }


def _json(rows: Iterable[dict]) -> Iterator[str]:
    """{"columns": [...], "rows": [{...}, ...]}, written row by row."""
    yield '{"columns": ' + json.dumps(COLUMNS) + ', "rows": ['
    for i, each in enumerate(rows):
        yield ("," if i else "") + "\n" + json.dumps(each)
    yield "\n]}\n"


@require_GET
@requires(VIEW)
def open_count(request: HttpRequest) -> HttpResponse:
    """The navigation's open events count, as a badge (nothing when none is open)."""
    return render(request, "events/open_count.html", {"count": services.open_count()})
