"""The fleet overview's node filter, sort and paging.

`NodeFilter` drives the overview page, its self-refreshing table fragment and
the fleet exports (and is built to drive the API's node list), so a download
holds exactly the nodes the table shows. Every figure the table needs is
denormalised on Node, so the table reads one table."""

from __future__ import annotations

import django_filters
from django import forms
from django.core.paginator import Page
from django.db.models import F, FloatField, Q, QuerySet, Value
from django.db.models.functions import Cast, NullIf
from django.utils.functional import cached_property

from gpufleet.core.filters import ListFilterSet
from gpufleet.core.paging import ListPaginator
from gpufleet.fleet.models import HEALTH_RANK, Attach, Health, Node

PROBLEMS = "problems"
HEALTH_CHOICES = [*Health.choices, (PROBLEMS, "Warning, failing or offline")]
OFFLINE_CHOICES = [("no", "Online only"), ("yes", "Offline only")]
DEFAULT_PER_PAGE = 50
PER_PAGE_CHOICES = [("25", "25"), ("100", "100"), ("200", "200")]

# Sort key -> the expressions it orders by (ascending); "-key" sorts descending.
# Name is always the tie-breaker so pages are stable between refreshes.
_SORTS = {
    "name": F("name"),
    "health": HEALTH_RANK,
    "gpus": F("gpu_count"),
    "vram": Cast("vram_used_mib", FloatField()) / NullIf(F("vram_total_mib"), Value(0)),
    "util": F("utilization_mean"),
    "attach": F("attach"),
    "driver": F("driver_version"),
    "toolkit": F("toolkit_version"),
    "reserved": F("gpus_reserved"),
    "free": Node.FREE,
    "last_seen": F("last_seen"),
}
SORT_CHOICES = [(key, key) for key in _SORTS] + [(f"-{key}", f"-{key}") for key in _SORTS]
# An admin opens the overview to see what is wrong: worst first. The API keeps
# name order (see NodeFilter's default_sort), which does not move under a client
# paging through it while health changes.
DEFAULT_SORT = "-health"
_NARROWING = ("q", "health", "attach", "driver", "offline")


class NodeFilter(ListFilterSet):
    """The overview's filters, sort (`sort`, "-key" descending) and page size (`per`).

    `NodeFilter(request.GET, queryset=Node.objects.all())`, then `is_valid()`,
    `errors` and `qs` (filtered and sorted; empty while invalid). Without a
    `sort`, the nodes come in `default_sort` order."""

    q = django_filters.CharFilter(method="_filter_q", max_length=200, label="Name or GPU")
    health = django_filters.ChoiceFilter(choices=HEALTH_CHOICES, method="_filter_health", empty_label="Any health")
    attach = django_filters.ChoiceFilter(choices=Attach.choices, empty_label="Any attach mode")
    # Any version is valid, so a bookmarked one no longer in the fleet still filters
    # (to nothing); the select only offers what the fleet runs (see __init__).
    driver = django_filters.CharFilter(field_name="driver_version", widget=forms.Select, label="Driver")
    offline = django_filters.ChoiceFilter(
        choices=OFFLINE_CHOICES, method="_filter_offline", empty_label="Online and offline", label="Reporting"
    )
    # Sort and page size are validated like filters but applied by filter_queryset
    # and paginate: their empty value still means something (the defaults).
    # Hidden: the table's column headers are its control, not the filter form.
    sort = django_filters.ChoiceFilter(
        choices=SORT_CHOICES, method="_applied_elsewhere", empty_label=None, widget=forms.HiddenInput, label="Sort"
    )
    per = django_filters.ChoiceFilter(
        choices=PER_PAGE_CHOICES, method="_applied_elsewhere", empty_label=str(DEFAULT_PER_PAGE), label="Per page"
    )

    class Meta:
        model = Node
        fields = ["q", "health", "attach", "driver", "offline", "sort", "per"]

    def __init__(self, data=None, queryset=None, *, default_sort: str = DEFAULT_SORT, driver_versions=None, **kwargs):
        super().__init__(data, queryset, **kwargs)
        self.default_sort = default_sort
        # The overview passes its summary's versions (a callable), read in the scan that
        # sums its tiles, instead of scanning the nodes again here.
        self._driver_versions = driver_versions or self._versions_run
        # A callable, so the versions are read only when the select is drawn: the
        # table fragment, the exports and the API never pay for that query.
        # Cached: drawing a select reads its choices more than once.
        self.filters["driver"].extra["widget"] = forms.Select(choices=lambda: self._driver_options)

    @staticmethod
    def _versions_run() -> list[str]:
        return list(
            Node.objects.exclude(driver_version="")
            .order_by("driver_version")
            .values_list("driver_version", flat=True)
            .distinct()
        )

    @cached_property
    def _driver_options(self) -> list[tuple[str, str]]:
        versions = list(self._driver_versions())
        wanted = self.data.get("driver", "")
        if wanted and wanted not in versions:
            # Shown selected, so the form says what the table is filtered by.
            versions.append(wanted)
        return [("", "Any driver"), *((v, v) for v in versions)]

    def _filter_health(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        if value == Health.OFFLINE:
            return queryset.filter(offline=True)
        if value == PROBLEMS:
            return queryset.exclude(offline=False, health=Health.OK)
        # A node that stopped reporting has no current health: never list it as ok.
        return queryset.filter(offline=False, health=value)

    def _filter_offline(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(offline=value == "yes")

    def _applied_elsewhere(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset

    def _filter_q(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        # "h100" finds the nodes with H100s as well as those named so.
        value = value.strip()
        return queryset.filter(Q(name__icontains=value) | Q(gpu_models__icontains=value)) if value else queryset

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        return super().filter_queryset(queryset).order_by(*_ordering(self.current_sort))

    @property
    def current_sort(self) -> str:
        return self.cleaned("sort") or self.default_sort

    @property
    def per_page(self) -> int:
        return int(self.cleaned("per") or DEFAULT_PER_PAGE)

    @property
    def active(self) -> bool:
        """Whether any filter (not sort or paging) narrows the fleet."""
        return any(self.cleaned(name) for name in _NARROWING)


# Sorts whose expression is never NULL take no NULLS LAST: the node_worst_first index
# serves the default sort only in the order it was made in, and indexes take none on SQLite.
_NEVER_NULL = {"name", "health"}


def _ordering(sort: str) -> list:
    descending = sort.startswith("-")
    key = sort.lstrip("-")
    expression = _SORTS[key]
    nulls = {} if key in _NEVER_NULL else {"nulls_last": True}
    first = expression.desc(**nulls) if descending else expression.asc(**nulls)
    return [first, "name"] if key != "name" else [first]


def paginate(node_filter: NodeFilter, page_number) -> Page:
    """One page of the filtered nodes; an out-of-range or junk page number gives
    the nearest page."""
    return ListPaginator(node_filter.qs, node_filter.per_page).get_page(page_number)
