"""`ListPaginator`: the pages of a list (claims, events, audit log, the API's) that never
count a whole big table on each view. It counts exactly up to ESTIMATE_FROM rows; past
that, on PostgreSQL, the total is the planner's estimate (`estimated`, shown "about N"),
and each page reads one row more than it shows, so whether another page follows never
rests on the estimate."""

from __future__ import annotations

import json

from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

# Counting more rows than this on every view costs as much as the page itself at fleet size.
ESTIMATE_FROM = 10_000


class ListPaginator(Paginator):
    """Django's Paginator over a QuerySet, with `estimated` set when the count is the
    planner's. `page(n)` raises EmptyPage past the last row; `get_page(n)` gives the
    nearest page instead, as Django's does."""

    estimated = False

    @cached_property
    def count(self) -> int:
        # Only the keys, unordered: the database can then skip the joins and the sort.
        keys = self.object_list.order_by().values("pk")
        counted = keys[: ESTIMATE_FROM + 1].count()
        if counted <= ESTIMATE_FROM or connections[keys.db].vendor != "postgresql":
            return counted if counted <= ESTIMATE_FROM else keys.count()  # SQLite keeps no estimate
        self.estimated = True
        return max(planned_rows(keys), counted)

    def validate_number(self, number) -> int:
        if not self.estimated:
            return super().validate_number(number)
        # Pages past the estimate may still hold rows: any page number may be asked for.
        try:
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger("That page number is not an integer") from None
        if number < 1:
            raise EmptyPage("That page number is less than 1")
        return number

    def page(self, number) -> Page:
        number = self.validate_number(number)
        if not self.estimated:
            return super().page(number)
        bottom = (number - 1) * self.per_page
        rows = list(self.object_list[bottom : bottom + self.per_page + 1])
        if not rows and number > 1:
            raise EmptyPage("That page contains no results")
        return _ReadAheadPage(rows[: self.per_page], number, self, more=len(rows) > self.per_page)

    def get_page(self, number) -> Page:
        try:
            return super().get_page(number)
        except EmptyPage:
            # The estimate was long: the last page is wherever the rows end.
            return self.page(1)


class _ReadAheadPage(Page):
    def __init__(self, object_list, number, paginator, *, more: bool):
        super().__init__(object_list, number, paginator)
        self._more = more

    def has_next(self) -> bool:
        return self._more

    def end_index(self) -> int:
        return self.start_index() + len(self.object_list) - 1 if self.object_list else 0


def planned_rows(queryset: QuerySet) -> int:
    """The PostgreSQL planner's estimate of how many rows `queryset` gives."""
    plan = json.loads(queryset.explain(format="json"))
    plan = plan[0] if isinstance(plan, list) else plan
    return int(plan["Plan"]["Plan Rows"])
