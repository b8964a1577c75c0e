"""`ListFilterSet`, the base of every list's filter set (overview, claims, audit,
and the API lists that reuse them)."""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet


class ListFilterSet(django_filters.FilterSet):
    """A list's filters as plain GET parameters (bookmarkable, the form works
    without JavaScript).

    An invalid value is an error for the caller to show (`errors`), and `qs` is
    then empty rather than filtered on the valid fields only: a list that quietly
    dropped one of the asked filters looks right and is wrong, and an export of
    it would hold more than was asked for."""

    @property
    def qs(self) -> QuerySet:
        if self.is_bound and not self.is_valid():
            return self.queryset.none()
        return super().qs

    def cleaned(self, name: str):
        """The valid value of one field, or "" when absent or invalid (the other
        fields' values stay usable while one of them is wrong)."""
        if not self.is_bound:
            return ""
        self.form.is_valid()  # validates once; the form keeps its result
        return self.form.cleaned_data.get(name) or ""

    @property
    def active(self) -> bool:
        """Whether any valid filter narrows the list."""
        return any(self.cleaned(name) for name in self.filters)

    def error_messages(self) -> list[str]:
        """Each error as "parameter: message", for answers that are not a page."""
        return [f"{name}: {message}" for name, messages in self.errors.items() for message in messages]
