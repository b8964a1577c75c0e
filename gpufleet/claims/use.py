"""Claims against real use, fleet-wide: the findings ingest makes where the claims
and the work on the GPUs disagree (gpu/usage.py), listed, filtered, sorted and
exported. Read from the stored findings, so the page costs the same few queries
on any fleet size."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import django_filters
from django import forms
from django.db.models import F, QuerySet

from gpufleet.core.filters import ListFilterSet
from gpufleet.fleet.models import Finding
from gpufleet.gpu.usage import USE_KINDS

# The findings this view is about, by code, in the words the node page uses.
KINDS = USE_KINDS
COLUMNS = ("node", "kind", "code", "status", "detail", "node_health", "collected_at")


def findings() -> QuerySet:
    return Finding.objects.filter(code__in=KINDS).select_related("node")


# Sort key -> what it orders by; "-key" reverses the first. Node, then kind, breaks
# ties, so pages neither share nor skip rows.
_SORTS = {
    "node": ("node__name", "code"),
    "kind": ("code", "node__name"),
    "collected": ("node__collected_at", "node__name", "code"),
}
DEFAULT_SORT = "node"


class UseFilter(ListFilterSet):
    """`kind` (a finding code), `q` (part of the node's name) and `sort` (node, kind
    or collected; "-key" descending)."""

    kind = django_filters.ChoiceFilter(field_name="code", choices=list(KINDS.items()), empty_label="Every kind",
                                       label="Kind")
    q = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains", max_length=200, label="Node",
                                  widget=forms.SearchInput(attrs={"placeholder": "node name"}))
    sort = django_filters.ChoiceFilter(
        choices=[(key, key) for key in _SORTS] + [(f"-{key}", f"-{key}") for key in _SORTS],
        method="_applied_elsewhere", empty_label=None, widget=forms.HiddenInput, label="Sort",
    )

    class Meta:
        model = Finding
        fields = ["kind", "q"]

    @property
    def current_sort(self) -> str:
        return self.cleaned("sort") or DEFAULT_SORT

    def _applied_elsewhere(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        first, *rest = _SORTS[self.current_sort.lstrip("-")]
        descending = self.current_sort.startswith("-")
        return super().filter_queryset(queryset).order_by(F(first).desc(nulls_last=True) if descending else first, *rest)


def rows(found: Iterable[Finding]) -> Iterator[dict]:
    for finding in found:
        yield {
            "node": finding.node.name,
            "kind": KINDS.get(finding.code, finding.name),
            "code": finding.code,
            "status": finding.status,
            "detail": finding.message,
            "node_health": finding.node.health,
            "collected_at": finding.node.collected_at.isoformat() if finding.node.collected_at else None,
        }


def as_json(found: Iterable[Finding]) -> Iterator[str]:
    """{"columns": [...], "rows": [{...}, ...]}, written row by row."""
    yield '{"columns": ' + json.dumps(COLUMNS) + ', "rows": ['
    for i, row in enumerate(rows(found)):
        yield ("," if i else "") + "\n" + json.dumps(row)
    yield "\n]}\n"


def as_csv_rows(found: Iterable[Finding]) -> Iterator[list]:
    for row in rows(found):
        yield [row[column] for column in COLUMNS]
