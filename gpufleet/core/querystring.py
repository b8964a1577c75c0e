"""Query strings as the URL bar and the links show them."""

from __future__ import annotations

from django.http import QueryDict


def clean_query(params) -> QueryDict:
    """`params` without empty values: what the URL bar and the links show, so a
    filter form sent as-is (every field, most of them empty) still bookmarks short."""
    query = QueryDict(mutable=True)
    for key, values in params.lists():
        kept = [v for v in values if v.strip()]
        if kept:
            query.setlist(key, kept)
    return query
