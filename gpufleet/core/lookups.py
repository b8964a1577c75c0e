"""`field__any=values`: `field__in=values` as one array parameter on PostgreSQL.

Django writes `IN (%s, %s, ...)` with a parameter for each value, and psycopg, which
caches the parsing of a query only up to 50 parameters, parses such a query anew each
time: with the hundreds of nodes of an ingest batch, several times what one
`= ANY(%s)` costs. Django has no lookup for it, hence this one,
registered on every field and foreign key (CoreConfig.ready). Elsewhere it is `__in`."""

from __future__ import annotations

from django.core.exceptions import EmptyResultSet
from django.db.models.lookups import In


class AnyOf(In):
    lookup_name = "any"

    def as_postgresql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = [value for value in self.rhs if value is not None]  # as __in: NULL equals nothing
        if not values:
            raise EmptyResultSet
        return f"{lhs} = ANY(%s)", (*lhs_params, values)
