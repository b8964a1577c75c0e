"""The fleet-wide claims list's filters: the page's, and built for the API's list."""

from __future__ import annotations

import django_filters
from django import forms
from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from django.utils.functional import cached_property

from gpufleet.claims.models import Claim
from gpufleet.core.filters import ListFilterSet
from gpufleet.fleet.models import Node


class ClaimFilter(ListFilterSet):
    """`node` (exact node name), `q` (part of the claim's or the node's name),
    `owner` (exact username) and `state` (booked: starts later; now: in force; ended).

    `ClaimFilter(request.GET, queryset=Claim.objects.all())`, then `is_valid()`,
    `errors` and `qs` (empty while invalid)."""

    # A text box, not a choice: the nodes holding claims are a share of the fleet,
    # thousands of options to read and draw on every view. Any name is valid, so a
    # bookmarked node that no longer holds claims still filters (to nothing).
    node = django_filters.CharFilter(field_name="node__name", max_length=200, label="Node")
    q = django_filters.CharFilter(
        method="_search",
        max_length=200,
        label="Search",
        widget=forms.SearchInput(attrs={"placeholder": "claim or node name"}),
    )

    owner = django_filters.CharFilter(field_name="owner__username", widget=forms.Select, label="Owner")
    state = django_filters.ChoiceFilter(
        method="_state", choices=[("booked", "Booked ahead"), ("now", "In force now"), ("ended", "Ended")],
        empty_label="Any time", label="When",
    )

    class Meta:
        model = Claim
        fields = ["node", "q", "owner", "state"]

    def __init__(self, data=None, queryset=None, **kwargs):
        super().__init__(data, queryset, **kwargs)
        # A callable, so the names are read only when the select is drawn (not for
        # the table fragment or the API); cached, as drawing reads them twice.
        self.filters["owner"].extra["widget"] = forms.Select(choices=lambda: self._owner_options)

    @cached_property
    def _owner_options(self) -> list[tuple[str, str]]:
        # The users (few) that own a claim, each looked up in the claims' owner index,
        # rather than every claim read and its owners sorted out.
        owns = Claim.objects.filter(owner=OuterRef("pk"))
        names = list(
            get_user_model().objects.filter(Exists(owns)).order_by("username").values_list("username", flat=True)
        )
        wanted = self.data.get("owner", "")
        if wanted and wanted not in names:
            names.append(wanted)
        return [("", "Any owner"), *((name, name) for name in names)]

    def _state(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        now = timezone.now()
        return {"booked": queryset.booked, "now": queryset.in_force, "ended": queryset.ended}[value](now)

    def _search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        # Two lookups, each through its own trigram index (claim names: claims 0002; node
        # names: fleet 0003), joined by a union: an OR across the join reads every claim.
        claims = Claim.objects.order_by().values("pk")
        by_name = claims.filter(name__icontains=value)
        on_node = claims.filter(node__in=Node.objects.filter(name__icontains=value).values("pk"))
        return queryset.filter(pk__in=by_name.union(on_node))
