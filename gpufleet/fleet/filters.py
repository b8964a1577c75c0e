"""The fleet overview's node filter, sort and paging.

One form drives the overview page, its self-refreshing table fragment and the
fleet exports, so a download holds exactly the nodes the table shows. Every
figure the table needs is denormalised on Node, so the table reads one table."""

from __future__ import annotations

from django import forms
from django.core.paginator import Page, Paginator
from django.db.models import Case, F, FloatField, IntegerField, QuerySet, Value, When
from django.db.models.functions import Cast, NullIf

from gpufleet.fleet.models import Attach, FindingStatus, Health, Node

PROBLEMS = "problems"
HEALTH_CHOICES = [("", "Any health"), *Health.choices, (PROBLEMS, "Warning, failing or offline")]
OFFLINE_CHOICES = [("", "Online and offline"), ("no", "Online only"), ("yes", "Offline only")]
DEFAULT_PER_PAGE = 50
# "" is the default, so an unfiltered URL and the form agree on what is shown.
PER_PAGE_CHOICES = [("", str(DEFAULT_PER_PAGE)), ("25", "25"), ("100", "100"), ("200", "200")]

# Sort key -> the expressions it orders by (ascending); "-key" sorts descending.
# Name is always the tie-breaker so pages are stable between refreshes.
# Health.rank in SQL: offline is worst, then the stored worst finding.
_HEALTH_RANK = Case(
    When(offline=True, then=Value(Health.OFFLINE.rank)),
    *(When(health=status, then=Value(status.rank)) for status in FindingStatus),
    output_field=IntegerField(),
)
_SORTS = {
    "name": F("name"),
    "health": _HEALTH_RANK,
    "gpus": F("gpu_count"),
    "vram": Cast("vram_used_mib", FloatField()) / NullIf(F("vram_total_mib"), Value(0)),
    "util": F("utilization_mean"),
    "attach": F("attach"),
    "driver": F("driver_version"),
    "toolkit": F("toolkit_version"),
    "reserved": F("gpus_reserved"),
    "free": F("gpu_count") - F("gpus_reserved"),
    "last_seen": F("last_seen"),
}
SORT_CHOICES = [(key, key) for key in _SORTS] + [(f"-{key}", f"-{key}") for key in _SORTS]
DEFAULT_SORT = "name"


class NodeFilterForm(forms.Form):
    """The overview's filters as plain GET parameters (bookmarkable, and the form
    works without JavaScript). An invalid value is ignored, not an error page."""

    q = forms.CharField(required=False, max_length=200, label="Name")
    health = forms.ChoiceField(required=False, choices=HEALTH_CHOICES)
    attach = forms.ChoiceField(required=False, choices=[("", "Any attach mode"), *Attach.choices])
    driver = forms.ChoiceField(required=False)
    offline = forms.ChoiceField(required=False, choices=OFFLINE_CHOICES, label="Reporting")
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES)
    per = forms.ChoiceField(required=False, choices=PER_PAGE_CHOICES, label="Per page")

    def __init__(self, data=None, *, driver_versions: list[str] | None = None):
        super().__init__(data)
        versions = list(driver_versions if driver_versions is not None else _driver_versions())
        wanted = (data or {}).get("driver", "")
        if wanted and wanted not in versions:
            # A bookmarked version no longer in the fleet still filters (to nothing).
            versions.append(wanted)
        self.fields["driver"].choices = [("", "Any driver"), *((v, v) for v in versions)]

    def value(self, name: str) -> str:
        """The cleaned value of a field, or "" when absent or invalid."""
        return (getattr(self, "cleaned_data", None) or {}).get(name) or ""

    @property
    def current_sort(self) -> str:
        # Not named `sort`: a class attribute of that name would replace the field.
        return self.value("sort") or DEFAULT_SORT

    @property
    def per_page(self) -> int:
        return int(self.value("per") or DEFAULT_PER_PAGE)

    @property
    def active(self) -> bool:
        """Whether any filter (not sort or paging) narrows the fleet."""
        return any(self.value(name) for name in ("q", "health", "attach", "driver", "offline"))


def _driver_versions() -> list[str]:
    return list(
        Node.objects.exclude(driver_version="")
        .order_by("driver_version")
        .values_list("driver_version", flat=True)
        .distinct()
    )


def filter_nodes(params, queryset: QuerySet | None = None) -> tuple[NodeFilterForm, QuerySet]:
    """The bound filter form and the filtered, sorted queryset for GET `params`."""
    form = NodeFilterForm(params)
    form.is_valid()  # invalid fields drop out of cleaned_data and so do not filter
    nodes = queryset if queryset is not None else Node.objects.all()

    if q := form.value("q").strip():
        nodes = nodes.filter(name__icontains=q)
    health = form.value("health")
    if health == Health.OFFLINE:
        nodes = nodes.filter(offline=True)
    elif health == PROBLEMS:
        nodes = nodes.exclude(offline=False, health=Health.OK)
    elif health:
        # A node that stopped reporting has no current health: never list it as ok.
        nodes = nodes.filter(offline=False, health=health)
    if attach := form.value("attach"):
        nodes = nodes.filter(attach=attach)
    if driver := form.value("driver"):
        nodes = nodes.filter(driver_version=driver)
    if offline := form.value("offline"):
        nodes = nodes.filter(offline=offline == "yes")

    return form, nodes.order_by(*_ordering(form.current_sort))


def _ordering(sort: str) -> list:
    descending = sort.startswith("-")
    expression = _SORTS[sort.lstrip("-")]
    first = expression.desc(nulls_last=True) if descending else expression.asc(nulls_last=True)
    return [first, "name"] if sort.lstrip("-") != "name" else [first]


def paginate(queryset: QuerySet, form: NodeFilterForm, page_number) -> Page:
    """One page of nodes; an out-of-range or junk page number gives the nearest page."""
    return Paginator(queryset, form.per_page).get_page(page_number)
