"""The API lists' pages: `?page=` numbers, PAGE_SIZE rows each, in the envelope the
lists have always had (count, page, pages, next, previous, results), and `estimated`:
a list of more rows than gpufleet.core.paging counts gives the database's estimate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.paginator import EmptyPage
from django.db.models import QuerySet
from django.http import HttpRequest
from ninja import Field, Schema
from ninja.pagination import PaginationBase

from gpufleet.api.errors import ApiError
from gpufleet.core.paging import ESTIMATE_FROM, ListPaginator

PAGE_SIZE = 100


class PageQuery(Schema):
    page: int = Field(1, ge=1, description="from 1; past the last page: 404 bad_page")


class Pages(PaginationBase):
    """For ninja's @paginate: `@paginate(Pages, serialize=...)` turns each row of the
    page into its answer with `serialize`, one call per row, no query of its own."""

    Input = PageQuery

    class Output(Schema):
        count: int = Field(description="rows in all pages")
        estimated: bool = Field(
            description=f"count and pages are the database's estimate: the list holds over {ESTIMATE_FROM:,} rows; "
            "follow next to the end"
        )
        page: int
        pages: int
        next: str | None = Field(description="the next page's URL; null on the last")
        previous: str | None = Field(description="the previous page's URL; null on the first")
        results: list[Any]

    items_attribute = "results"

    def __init__(self, *, serialize: Callable[[Any], dict], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.serialize = serialize

    def paginate_queryset(self, queryset: QuerySet, pagination: PageQuery, request: HttpRequest, **params: Any) -> dict:
        paginator = ListPaginator(queryset, PAGE_SIZE)
        try:
            page = paginator.page(pagination.page)
        except EmptyPage:
            raise ApiError(404, "bad_page", f"there is no page {pagination.page}") from None

        def link(number: int) -> str:
            query = request.GET.copy()
            query["page"] = str(number)
            return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

        return {
            "count": paginator.count,
            "estimated": paginator.estimated,
            "page": page.number,
            "pages": paginator.num_pages,
            "next": link(page.next_page_number()) if page.has_next() else None,
            "previous": link(page.previous_page_number()) if page.has_previous() else None,
            "results": [self.serialize(row) for row in page.object_list],
        }
