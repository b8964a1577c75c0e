"""Writing many rows of one model in a fixed number of statements, inside the caller's
transaction: `insert`, `upsert`, `update` and `replace`.

On PostgreSQL the rows go through COPY. Django's bulk_create prepares every value in
Python (each field's get_db_prep_save, then psycopg dumps the arrays it unnests), and
that was about two thirds of what storing a batch of snapshots cost; COPY hands plain
tuples to psycopg's C writer. django-pgbulk's copy() still prepares each value through
its field and cannot upsert, and no other maintained library copies into the caller's
transaction, hence this module. Elsewhere (SQLite) they are Django's bulk_create and
bulk_update.

`insert`, `upsert` and `replace` take rows as tuples, `update` model instances. Only
plain column values are written: JSON fields are encoded here, every other value must
already be what the column takes (int, float, str, bool, datetime, None)."""

from __future__ import annotations

import functools
import hashlib
import json
import operator
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
            # psycopg's own loader, in C, reads the returned timestamps: Django's, in
            # Python, only sets the time zone the session's UTC gives already, at three
            # times the cost (16 timestamps an 8-GPU snapshot).
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


def replace(model: type[models.Model], parent: str, fields: Sequence[str], rows: dict[int, Sequence[tuple]]) -> list[int]:
    """Make the rows of `model` whose `parent` (a foreign key's attname, "node_id") is a key
    of `rows` exactly that key's tuples of `fields`, and return the keys whose rows had
    to be written: only their rows are deleted and inserted. A parent's rows are compared
    in the order of the first field, an integer unique among them; `fields` are integer
    and text columns, none of them null.

    Comparing costs one read; writing a parent's rows again costs deleting and inserting
    each through every index, and the dead rows left for vacuum to clear. Most of what
    a node reports (its findings) is the same from one snapshot to the next: rewriting
    them was a third of PostgreSQL's work storing a snapshot."""
    if not rows:
        return []
    meta = model._meta
    key = meta.get_field(parent)
    stored = _stored_digests(model, key, fields, list(rows)) if connection.vendor == "postgresql" else (
        _stored_digests_elsewhere(model, key, fields, list(rows)))
    changed = [pk for pk, each in rows.items() if stored.get(pk) != _digest(sorted(each, key=operator.itemgetter(0)))]
    if changed:
        model.objects.filter(**{f"{key.attname}__any": changed}).delete()
        insert(model, [key.attname, *fields], [(pk, *row) for pk in changed for row in rows[pk]])
    return changed


def _digest(rows: Sequence[tuple]) -> str | None:
    """The MD5 of `rows` as _stored_digests has PostgreSQL write them, None for no rows:
    each value as text after its length, so that no two sets of rows read the same."""
    if not rows:
        return None
    text = "\x1e".join("\x1f".join(f"{len(value)}\x1f{value}" for value in map(str, row)) for row in rows)
    # surrogatepass: text no UTF-8 holds (validation keeps it out) still gets a digest,
    # and then the COPY's refusal, which callers handle as the database's.
    return hashlib.md5(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def _stored_digests(model, key, fields: Sequence[str], keys: list) -> dict:
    """For each of `keys` that has rows, the _digest of its rows as stored."""
    columns = [_quoted(model._meta.get_field(name).column) for name in fields]
    values = ", ".join(f"length({column}::text), {column}::text" for column in columns)
    with connection.cursor() as cursor:
        # chr(31) and chr(30): ASCII's unit and record separators.
        cursor.execute(f"SELECT {_quoted(key.column)}, md5(string_agg(concat_ws(chr(31), {values}), chr(30)"
                       f" ORDER BY {columns[0]})) FROM {_quoted(model._meta.db_table)}"
                       f" WHERE {_quoted(key.column)} = ANY(%s) GROUP BY 1", [keys])
        return dict(cursor.fetchall())


def _stored_digests_elsewhere(model, key, fields: Sequence[str], keys: list) -> dict:
    stored: dict = {}
    for pk, *row in (model.objects.filter(**{f"{key.attname}__any": keys}).order_by(key.attname, fields[0])
                     .values_list(key.attname, *fields)):
        stored.setdefault(pk, []).append(tuple(row))
    return {pk: _digest(each) for pk, each in stored.items()}


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
    """A datetime's text for one COPY, made once for each distinct value. psycopg makes
    it anew for every value it copies (isoformat, at 1.5 us here), and a batch's
    timestamps repeat: its own `now` on every row, each snapshot's time on each of its
    GPUs' rows (40 timestamps an 8-GPU snapshot, a tenth of storing it)."""
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
