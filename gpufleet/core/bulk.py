"""Writing many rows of one model in a fixed number of statements, inside the caller's
transaction: `insert`, `upsert` and `update`; and reading many back as tuples: `rows`.

On PostgreSQL the rows go through COPY. Django's bulk_create prepares every value in
Python (each field's get_db_prep_save, then psycopg dumps the arrays it unnests), and
that was about two thirds of what storing a batch of snapshots cost; COPY hands plain
tuples to psycopg's C writer. django-pgbulk's copy() still prepares each value through
its field and cannot upsert, and no other maintained library copies into the caller's
transaction, hence this module. Elsewhere (SQLite) they are Django's bulk_create and
bulk_update.

`insert` and `upsert` take rows as tuples, `update` model instances. Only
plain column values are written: JSON fields are encoded here, every other value must
already be what the column takes (int, float, str, bool, datetime, None)."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence

import pydantic_core
from django.db import DataError, connection, models


def insert(model: type[models.Model], fields: Sequence[str], rows: Sequence[tuple]) -> None:
    """INSERT `rows`, tuples of the `fields` named (attribute names: "node_id" for a
    foreign key); the other columns take their defaults. Tuples rather than model
    instances, because making instances was most of what a large insert cost here."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_create([model(**dict(zip(fields, row, strict=True))) for row in rows])
        return
    columns = [model._meta.get_field(name) for name in fields]
    with connection.cursor() as cursor:
        _copy(cursor, _quoted(model._meta.db_table), columns, rows, from_tuples=True)


def upsert(model: type[models.Model], fields: Sequence[str], rows: Sequence[tuple], unique_fields: Sequence[str],
           update_fields: Sequence[str], keep_when_null: Sequence[str] = (),
           returning: Sequence[str] = ()) -> dict[tuple, tuple]:
    """INSERT `rows`, tuples of the `fields` named (as for `insert`), or UPDATE only
    `update_fields` of the rows that have their `unique_fields` already. Of
    `update_fields`, those in `keep_when_null` keep their stored value where the new one
    is None. Returns, for each row's values of `unique_fields` (a tuple), the primary key
    and then the fields named in `returning` as the row holds them afterwards (a field
    not updated keeps the stored value). Rows are written in the order of their unique
    fields, so two concurrent upserts cannot deadlock."""
    if not rows:
        return {}
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    unique = [meta.get_field(name) for name in unique_fields]
    returned = [meta.get_field(name) for name in returning]
    if connection.vendor != "postgresql":
        return _upsert_elsewhere(model, columns, rows, unique, update_fields, keep_when_null, returned)
    updated = {meta.get_field(name) for name in update_fields}
    kept = {meta.get_field(name) for name in keep_when_null}
    table, staging = _quoted(meta.db_table), _quoted(f"bulk_in_{meta.db_table}")
    names = ", ".join(_quoted(f.column) for f in columns)
    keys = ", ".join(_quoted(f.column) for f in unique)
    updates = ", ".join(
        f"{_quoted(f.column)} = COALESCE(EXCLUDED.{_quoted(f.column)}, {table}.{_quoted(f.column)})" if f in kept
        else f"{_quoted(f.column)} = EXCLUDED.{_quoted(f.column)}"
        for f in columns if f in updated
    )
    extra = "".join(f", {_quoted(f.column)}" for f in returned)
    with connection.cursor() as cursor:
        _stage(cursor, table, staging, columns, rows, from_tuples=True)
        if connection.timezone_name == "UTC":
            # psycopg's C loader reads the returned timestamps; Django's, in Python, only
            # adds the UTC the session gives already (kept: docs/performance.md).
            cursor.cursor.adapters.register_loader("timestamptz", _c_timestamptz_loader())
        cursor.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {staging} ORDER BY {keys}"
                       f" ON CONFLICT ({keys}) DO UPDATE SET {updates}"
                       f" RETURNING {_quoted(meta.pk.column)}, {keys}{extra}")
        stored = cursor.fetchall()
    width = len(unique)
    converted = [(i, field) for i, field in enumerate(returned, start=1 + width) if hasattr(field, "from_db_value")]
    written = {}
    for row in stored:
        values = list(row)
        for i, field in converted:
            values[i] = field.from_db_value(values[i], None, connection)
        written[tuple(values[1:1 + width])] = (values[0], *values[1 + width:])
    return written


def update(model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]) -> None:
    """UPDATE only `fields` of the rows of `objs`, by primary key, in one set-based
    statement: the other fields of the objects are never read, so they may be deferred.
    Django's bulk_update builds a CASE for every row and field instead. The rows are
    updated in no particular order: where two transactions may update the same rows,
    lock them first in a fixed order (ingest locks its nodes by name)."""
    if not objs:
        return
    if connection.vendor != "postgresql":
        model.objects.bulk_update(objs, fields)
        return
    meta = model._meta
    columns = [meta.pk, *(meta.get_field(name) for name in fields)]
    table, staging = _quoted(meta.db_table), _quoted(f"bulk_set_{meta.db_table}")
    key = _quoted(meta.pk.column)
    updates = ", ".join(f"{_quoted(f.column)} = staged.{_quoted(f.column)}" for f in columns[1:])
    with connection.cursor() as cursor:
        _stage(cursor, table, staging, columns, objs)
        cursor.execute(f"UPDATE {table} SET {updates} FROM {staging} AS staged WHERE {table}.{key} = staged.{key}")


def rows(queryset: models.QuerySet, fields: Sequence[str]) -> list[tuple]:
    """The `fields` (attribute names) of the rows `queryset` selects, as tuples, in no
    particular order (its ordering is dropped), as `values_list` reads them. In one
    statement; on PostgreSQL in UTC, psycopg's C loader reads the timestamps, as for
    `upsert`'s returned ones, rather than Django's, in Python."""
    query = queryset.order_by().values_list(*fields)
    if connection.vendor != "postgresql" or connection.timezone_name != "UTC":
        return list(query)
    sql, params = query.query.sql_with_params()
    converted = [(i, field) for i, field in enumerate(queryset.model._meta.get_field(name) for name in fields)
                 if hasattr(field, "from_db_value")]
    with connection.cursor() as cursor:
        cursor.cursor.adapters.register_loader("timestamptz", _c_timestamptz_loader())
        cursor.execute(sql, params)
        found = cursor.fetchall()
    if not converted:
        return found
    read = []
    for row in found:
        values = list(row)
        for i, field in converted:
            values[i] = field.from_db_value(values[i], None, connection)
        read.append(tuple(values))
    return read


@functools.cache
def _c_timestamptz_loader():
    from psycopg import adapters, pq

    return adapters.get_loader(adapters.types["timestamptz"].oid, pq.Format.TEXT)


def _upsert_elsewhere(model, columns, rows, unique, update_fields, keep_when_null, returned) -> dict[tuple, tuple]:
    """`upsert` through bulk_create, which can neither keep a stored value nor return
    one: those are read first (one query, while the caller's transaction holds the rows)."""
    objs = [model(**{f.attname: value for f, value in zip(columns, row, strict=True)}) for row in rows]
    if keep_when_null or returned:
        first = unique[0]
        wanted = [*unique, *{*(model._meta.get_field(name) for name in keep_when_null), *returned}]
        stored = {
            tuple(row[:len(unique)]): dict(zip((f.attname for f in wanted[len(unique):]), row[len(unique):], strict=True))
            for row in model.objects.filter(**{f"{first.attname}__in": {getattr(o, first.attname) for o in objs}})
            .values_list(*(f.attname for f in wanted))
        }
        for obj in objs:
            values = stored.get(tuple(getattr(obj, f.attname) for f in unique))
            if values is None:
                continue
            for name in keep_when_null:
                if getattr(obj, name) is None:
                    setattr(obj, name, values[name])
            for field in returned:
                if field.name not in update_fields:
                    setattr(obj, field.attname, values[field.attname])
    model.objects.bulk_create(objs, update_conflicts=True, unique_fields=[f.name for f in unique],
                              update_fields=update_fields)
    return {
        tuple(getattr(obj, f.attname) for f in unique): (obj.pk, *(getattr(obj, f.attname) for f in returned))
        for obj in objs
    }


def _stage(cursor, table: str, staging: str, columns: list, objs: Sequence, from_tuples: bool = False) -> None:
    """COPY `objs` (model instances, or tuples `from_tuples`) into `staging`, the session's
    own table of `columns` of `table`, made the first time and emptied by each commit;
    CREATE ... AS ... WITH NO DATA takes the columns' types but none of their NOT NULL
    constraints or defaults."""
    names = ", ".join(_quoted(f.column) for f in columns)
    cursor.execute(f"CREATE TEMPORARY TABLE IF NOT EXISTS {staging} ON COMMIT DELETE ROWS AS"
                   f" SELECT {names} FROM {table} WITH NO DATA")
    cursor.execute(f"DELETE FROM {staging}")  # rows of an earlier write in this transaction
    _copy(cursor, staging, columns, objs, from_tuples)


def _copy(cursor, table: str, columns: list, objs: Sequence, from_tuples: bool = False) -> None:
    sql = f"COPY {table} ({', '.join(_quoted(f.column) for f in columns)}) FROM STDIN"
    attnames = [f.attname for f in columns]
    # JSON values need encoding, timestamps are written once each; the rest go to psycopg
    # as they are.
    encoded = [(i, _json_encoder(f.encoder)) for i, f in enumerate(columns) if isinstance(f, models.JSONField)]
    encoded += [(i, _timestamp_writer()) for i, f in enumerate(columns) if isinstance(f, models.DateTimeField)]
    started = time.monotonic()
    # COPY goes to psycopg's own cursor, past Django's wrapper: its errors are wrapped
    # here, so that callers catch Django's DatabaseError for them as for any statement's
    # (ingest stores a refused batch's snapshots one by one). Text that no UTF-8 holds
    # (a lone surrogate) psycopg refuses before PostgreSQL could: refused the same way.
    try:
        with connection.wrap_database_errors, cursor.cursor.copy(sql) as copy:
            for obj in objs:
                values = list(obj) if from_tuples else [getattr(obj, name) for name in attnames]
                for i, encode in encoded:
                    values[i] = encode(values[i])
                copy.write_row(values)
    except UnicodeEncodeError as exc:
        raise DataError(f"text the database cannot hold: {exc}") from exc
    _logged(sql, started)


def _json_encoder(encoder):
    if encoder is None:
        return lambda value: None if value is None else _json_text(value)
    return lambda value: None if value is None else json.dumps(value, cls=encoder)


def _json_text(value) -> str:
    # pydantic-core's serializer, in Rust, writes plain JSON values in a quarter of the
    # time json.dumps takes: ingest writes each GPU's health, eight JSON objects an
    # 8-GPU snapshot. What it cannot write (a lone surrogate, which no UTF-8 holds)
    # json.dumps writes as it always did, for PostgreSQL to refuse; NaN is written as
    # json.dumps writes it, for the same reason.
    try:
        return pydantic_core.to_json(value, inf_nan_mode="constants").decode()
    except pydantic_core.PydanticSerializationError:
        return json.dumps(value)


def _timestamp_writer():
    """A datetime's text for one COPY, made once for each distinct value: a batch's
    timestamps repeat (its `now` on every row, each snapshot's time on its GPUs' rows),
    and psycopg would format each again (kept: docs/performance.md)."""
    texts: dict = {}

    def text(value):
        if value is None:
            return None
        written = texts.get(value)
        if written is None:
            written = texts[value] = value.isoformat()
        return written

    return text


def _logged(sql: str, started: float) -> None:
    # COPY bypasses Django's cursor wrapper: log it as the wrapper logs a statement, so
    # the statement counts that tests and the bench take include it.
    if connection.queries_logged:
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})


def _quoted(name: str) -> str:
    return connection.ops.quote_name(name)
