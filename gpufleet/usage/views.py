"""The Usage page (GPU-hours reserved and used over a period, grouped by one key), its
CSV and JSON exports, and the "this month" panels the node page and the claim page
load after them (claims and fleet sit below usage, so they cannot ask for usage
themselves; their templates name these URLs).

Each answer reads one report (report.report: one GROUP BY for the groups, whose sums
are the total) and at most one more query for the links of the groups shown, whatever the
number of groups."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from urllib.parse import urlencode

from django.conf import settings
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, QueryDict
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from gpufleet.claims.models import Claim
from gpufleet.core import downloads
from gpufleet.core.access import VIEW, requires
from gpufleet.core.htmx import render_page, wants_fragment
from gpufleet.core.querystring import clean_query
from gpufleet.fleet.models import Node
from gpufleet.usage import charts
from gpufleet.usage import period as periods
from gpufleet.usage import query as queries
from gpufleet.usage.forms import BY, PRESETS, UsageForm, sort_rows
from gpufleet.usage.report import GROUPS, Report, Row, report

PAGE_SIZE = 100
PANEL_ROWS = 10
PAGE = "usage/usage.html"
PANEL = "usage/panel.html"
# The figure columns of the table, by sort key, in the order shown.
COLUMNS = (
    ("reserved", "Reserved", "GPU-hours a claim held"),
    ("used", "Used", "GPU-hours busy, reserved or not"),
    ("idle_reserved", "Idle reserved", "Reserved but not busy"),
    ("used_unreserved", "Used unreserved", "Busy on GPUs no claim held"),
    ("efficiency", "Efficiency", "Of the reserved hours, the share busy"),
    ("energy", "Energy kWh", "Energy drawn over the hours with a power reading"),
    ("cost", "Cost", "Held GPU-hours times their price, plus energy times its price"),
    ("unknown", "Unknown", "GPU-hours no snapshot covered: the node was silent"),
)
# The export's figures: the API's field names (Row.as_dict), the key apart.
FIGURES = [name for name in Row(key={}, reserved=0, used=0, idle_reserved=0, used_unreserved=0, unknown=0,
                                power_unknown=0, energy_kwh=None, cost=None).as_dict() if name != "key"]
# What the query carries from one view of the page to the next: the period asked for.
PERIOD_PARAMETERS = ("period", "from", "to")


def priced() -> bool:
    return bool(settings.GPUFLEET_PRICE_GPU_HOUR) or settings.GPUFLEET_PRICE_KWH is not None


@require_GET
@requires(VIEW)
def usage(request: HttpRequest) -> HttpResponse:
    """The page: the period's groups, largest first or sorted by a figure, a page of
    them at a time, with the chart of the largest and the total. A period or filter
    that cannot be read is said on the page (200, so HTMX swaps it in), with no rows."""
    form = UsageForm(request.GET, now=timezone.now())
    found = _report(form)
    query = clean_query(request.GET)
    exported = query.copy()
    exported.pop("page", None)
    rows = sort_rows(found.rows, form.current_sort) if found else []
    page = Paginator(rows, PAGE_SIZE).get_page(request.GET.get("page"))
    keep = _period_query(query)
    by = form.group
    context = {
        "form": form,
        "fragment": wants_fragment(request),
        "report": found,
        "by": by,
        "by_label": BY[by],
        "period": form.asked,
        "period_name": _period_name(form),
        "presets": [(name, label, f"?{_with(_without(query, *PERIOD_PARAMETERS, 'page'), period=name)}")
                    for name, label in PRESETS.items()],
        "groups": _groups(by, page.object_list, keep),
        "page": page,
        "query": query,
        "base_url": reverse("usage:page"),
        "export_query": exported.urlencode(),
        "headers": _headers(query, form.current_sort),
        "priced": priced(),
        "currency": settings.GPUFLEET_CURRENCY,
        "chart": charts.bar_chart(((_chart_label(by, row.key), row.reserved, row.used) for row in found.rows),
                                  total=len(found.rows)) if found else None,
        "narrowed": _narrowed(form, query),
        "mine": f"?{_with(keep, by='claim', owner=request.user.get_username())}",
        "columns": 1 + len(COLUMNS) - (0 if priced() else 1),
    }
    return render_page(request, PAGE, context, partial="usage-report")


@require_GET
@requires(VIEW, tokens=True)
def export(request: HttpRequest, fmt: str) -> HttpResponse:
    """The page's groups (all of them, in its order) and the total, as CSV or JSON with
    the API's field names. A period or filter that cannot be read is a 400: a download
    of something else than was asked would mislead."""
    form = UsageForm(request.GET, now=timezone.now())
    found = _report(form)
    if found is None:
        lines = ["No export: these values are not valid.",
                 *(f"{name if name != '__all__' else 'period'}: {message}"
                   for name, messages in form.errors.items() for message in messages)]
        return HttpResponseBadRequest("\n".join(lines) + "\n", content_type="text/plain; charset=utf-8")
    rows = sort_rows(found.rows, form.current_sort)
    body = _json(found, rows) if fmt == "json" else _csv(found, rows)
    return downloads.download(body, fmt, f"gpufleet-usage-by-{found.by}")


# --- the panels of the node page and the claim page ----------------------------


@require_GET
@requires(VIEW)
def node_month(request: HttpRequest, node_id: int) -> HttpResponse:
    """This month on one node, by claim: the node page loads it after itself."""
    filters = {"node_id": node_id}
    if not wants_fragment(request):
        return redirect(f"{reverse('usage:page')}?{urlencode({'by': 'claim', **filters})}")
    month = periods.current("month", timezone.now())
    found = report(month.start, month.end, "claim", filters)
    context = {"month": month, "report": found, "groups": _groups("claim", found.rows[:PANEL_ROWS], QueryDict()),
               "more": max(0, len(found.rows) - PANEL_ROWS), "priced": priced(),
               "currency": settings.GPUFLEET_CURRENCY,
               "page_url": f"{reverse('usage:page')}?{urlencode({'by': 'claim', **filters})}"}
    return render_page(request, PANEL, context, partial="node-month")


@require_GET
@requires(VIEW)
def claim_month(request: HttpRequest, claim_id: int) -> HttpResponse:
    """This month of one claim: the claim's page loads it after itself."""
    filters = {"claim_id": claim_id}
    if not wants_fragment(request):
        return redirect(f"{reverse('usage:page')}?{urlencode({'by': 'claim', **filters})}")
    month = periods.current("month", timezone.now())
    found = report(month.start, month.end, "claim", filters)
    context = {"month": month, "total": found.total, "priced": priced(), "currency": settings.GPUFLEET_CURRENCY,
               "page_url": f"{reverse('usage:page')}?{urlencode({'by': 'claim', **filters})}"}
    return render_page(request, PANEL, context, partial="claim-month")


# --- helpers -----------------------------------------------------------------------


def _report(form: UsageForm) -> Report | None:
    if not form.is_valid() or form.asked is None:
        return None
    return report(form.asked.start, form.asked.end, form.group, form.filters)


def _period_name(form: UsageForm) -> str:
    if form.asked is None:
        return ""
    if form.asked.name in PRESETS:
        return f"{PRESETS[form.asked.name].lower()} so far"
    return f"{form.asked.first_day:%Y-%m-%d} to {form.asked.last_day:%Y-%m-%d}"


def _period_query(query: QueryDict) -> QueryDict:
    """The part of `query` that says which period: what a group's link keeps."""
    kept = QueryDict(mutable=True)
    for name in PERIOD_PARAMETERS:
        if name in query:
            kept.setlist(name, query.getlist(name))
    return kept


def _without(query: QueryDict, *names: str) -> QueryDict:
    copy = query.copy()
    for name in names:
        copy.pop(name, None)
    return copy


def _with(query: QueryDict, **values) -> str:
    copy = query.copy()
    for name, value in values.items():
        copy[name] = value
    return copy.urlencode()


def _page_link(keep: QueryDict, **values) -> str:
    return f"{reverse('usage:page')}?{_with(keep, **values)}"


def _groups(by: str, rows: list[Row], keep: QueryDict) -> list[dict]:
    """Each row with how to name it and where its name links: to the claims or
    nodes behind it. One query for the claims or nodes that still exist, if any."""
    claims: dict[int, str] = {}
    nodes: dict[int, str] = {}
    if by == "claim":
        ids = [row.key["claim_id"] for row in rows if row.key["claim_id"] is not None]
        claims = dict(Claim.objects.filter(pk__in=ids).values_list("pk", "node__name")) if ids else {}
    elif by == "node":
        ids = [row.key["node_id"] for row in rows]
        nodes = dict(Node.objects.filter(pk__in=ids).values_list("pk", "name")) if ids else {}
    return [_group(by, row, keep, claims, nodes) for row in rows]


def _group(by: str, row: Row, keep: QueryDict, claims: dict[int, str], nodes: dict[int, str]) -> dict:
    key = row.key
    group = {"row": row, "name": "", "none": "", "url": "", "sub": "", "links": []}
    if by == "owner":
        if key["owner"]:
            group.update(name=key["owner"], url=f"{reverse('claims:list')}?{urlencode({'owner': key['owner']})}",
                         links=[("by claim", _page_link(keep, by="claim", owner=key["owner"]))])
        else:
            group["none"] = "no owner (unreserved, or a claim without one)"
    elif by == "team":
        if key["team"]:
            group.update(name=key["team"], url=_page_link(keep, by="owner", team=key["team"]),
                         links=[("by claim", _page_link(keep, by="claim", team=key["team"]))])
        else:
            group["none"] = "no team (unreserved, or a claim without one)"
    elif by == "claim":
        if key["claim_id"] is None:
            group["none"] = "unreserved"
        else:
            group["name"] = key["claim"]
            if key["claim_id"] in claims:
                node = claims[key["claim_id"]]
                group["url"] = f"{reverse('fleet:node_detail', args=[node])}#claim-{key['claim_id']}"
        group["sub"] = " · ".join(part for part in (f"on {key['node']}", key["owner"]) if part)
    elif by == "node":
        group["name"] = key["node"]
        if key["node_id"] in nodes:
            group["url"] = reverse("fleet:node_detail", args=[nodes[key["node_id"]]])
    elif by in ("image", "model"):
        if key[by]:
            group.update(name=key[by], url=_page_link(keep, by="node", **{by: key[by]}))
        else:
            group["none"] = "no container image (host processes, idle GPUs)" if by == "image" else "model not reported"
    else:
        group["name"] = key[by]
        group["none"] = "" if key[by] else "no label"
    return group


def _chart_label(by: str, key: dict) -> str:
    if by == "claim":
        return f"{key['claim'] or 'unreserved'} on {key['node']}"
    if by == "node":
        return key["node"]
    return key[by] or "(none)"


def _headers(query: QueryDict, current: str) -> list[dict]:
    """The figure columns' headers: a first click sorts largest first, the next
    smallest first; each a link that works without JavaScript, back to page 1."""
    headers = []
    for key, label, title in COLUMNS:
        if current == f"-{key}":
            target, aria, arrow = key, "descending", "▼"
        elif current == key:
            target, aria, arrow = f"-{key}", "ascending", "▲"
        else:
            target, aria, arrow = f"-{key}", "none", ""
        headers.append({"key": key, "label": label, "title": title, "aria": aria, "arrow": arrow,
                        "url": f"{reverse('usage:page')}?{_with(_without(query, 'page'), sort=target)}"})
    return headers


def _narrowed(form: UsageForm, query: QueryDict) -> list[dict]:
    """The node and claim the page is narrowed to (set by links, not typed), each with
    the link that drops it. Their names cost one query each, only when narrowed."""
    narrowed = []
    if not form.is_valid():
        return narrowed
    for name, model, field, label in (("node_id", Node, "name", "node"), ("claim_id", Claim, "name", "claim")):
        value = form.cleaned_data.get(name)
        if value:
            found = model.objects.filter(pk=value).values_list(field, flat=True).first()
            narrowed.append({"what": label, "name": found or f"#{value} (deleted)",
                             "drop": f"?{_without(query, name, 'page').urlencode()}"})
    return narrowed


def _json(found: Report, rows: list[Row]) -> Iterator[str]:
    """What GET /api/usage/ answers for the same question, the rows in the page's order."""
    yield json.dumps(queries.answer(dataclasses.replace(found, rows=rows))) + "\n"


def _csv(found: Report, rows: list[Row]) -> Iterator[str]:
    """One line a group, its key's columns flattened, then the total ("row": total)."""
    keys = GROUPS[found.by]

    def line(kind: str, row: Row) -> list:
        figures = row.as_dict()
        return [kind, *(row.key.get(name) for name in keys), *(_number(figures[name]) for name in FIGURES)]

    body = [line("group", row) for row in rows] + [line("total", found.total)]
    return downloads.csv_stream(["row", *keys, *FIGURES], body)


def _number(value: float | None) -> float | None:
    # Rounded past float noise, and never -0.0, which a spreadsheet guard would take for a formula.
    return None if value is None else round(value, 6) + 0.0
