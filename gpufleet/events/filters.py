"""The Events page's filters, shared with its CSV/JSON export and `GET /api/events/`."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from gpufleet.core.filters import ListFilterSet
from gpufleet.events.models import Event, Kind, Muted, Severity


def listed() -> QuerySet:
    """The events a list shows: opened (not pending), with their node, in the model's
    order (open first, then the newest)."""
    return Event.objects.filter(opened_at__isnull=False).select_related("node")


class EventFilter(ListFilterSet):
    """`kind`, `severity`, `node` (exact name), `gpu_model` (part of a model name of the
    node), `state` (open or closed), `muted` (silenced, maintenance, or no: neither), and
    a time range: `since` and `until` keep the events open at some moment between them
    (an event still open counts up to now).

    `EventFilter(request.GET, queryset=listed())`, then `is_valid()`, `errors` and `qs`."""

    kind = django_filters.ChoiceFilter(choices=Kind.choices, empty_label="Any kind", label="Kind")
    severity = django_filters.ChoiceFilter(choices=Severity.choices, empty_label="Any severity", label="Severity")
    node = django_filters.CharFilter(field_name="node__name", max_length=200, label="Node")
    gpu_model = django_filters.CharFilter(
        field_name="node__gpu_models", lookup_expr="icontains", max_length=200, label="GPU model",
        widget=forms.TextInput(attrs={"placeholder": "e.g. H200"}),
    )
    state = django_filters.ChoiceFilter(
        method="_state", choices=[("open", "Open"), ("closed", "Closed")], empty_label="Open or closed", label="State"
    )
    muted = django_filters.ChoiceFilter(
        method="_muted", choices=[(Muted.SILENCED, "Silenced"), (Muted.MAINTENANCE, "In maintenance"), ("no", "No")],
        empty_label="Muted or not", label="Muted")
    since = django_filters.IsoDateTimeFilter(
        method="_since", label="Since", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
    until = django_filters.IsoDateTimeFilter(
        method="_until", label="Until", widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))

    class Meta:
        model = Event
        fields = ["kind", "severity", "node", "gpu_model", "state", "muted", "since", "until"]

    def _state(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(closed_at__isnull=value == "open")

    def _muted(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(muted=Muted.NO if value == "no" else value)

    def _since(self, queryset: QuerySet, name: str, value) -> QuerySet:
        return queryset.filter(Q(closed_at__isnull=True) | Q(closed_at__gte=value))

    def _until(self, queryset: QuerySet, name: str, value) -> QuerySet:
        return queryset.filter(opened_at__lte=value)
