"""Bulk writes for a cycle that touches tens of thousands of rows at once.

On PostgreSQL, rows are inserted with COPY (no model instances, no giant INSERT text for the client-side
binding to splice; binary where every column has a plain binary form), and large id sets are passed as
one array parameter (`= ANY(%s)`) instead of an IN list of 20,000 placeholders. Not
`IN (SELECT unnest(%s))`: right after a commit moved 20,000 rows to a state the table's statistics
have not seen yet, the planner takes that state for one row and runs the
unnest once per row it finds (a nested loop: 49 s for the executor's start of 19,992 admissions).
Upserts (`upsert_rows`) COPY into a temporary table and merge it with one
`INSERT ... SELECT ... ON CONFLICT DO UPDATE`. Elsewhere (SQLite, the embedded default) the same calls fall
back to bulk_create (with update_conflicts for upserts) and `pk__in`, which are fast enough at the sizes
the embedded default sees.
A JSON value may come already encoded, as JsonText: COPY hands it to the server as it is.
Errors come out as Django's database exceptions either way (an IntegrityError for a second active
allocation of one device), so callers handle them as they would for the ORM.
"""

import json
import threading
from functools import partial
from itertools import chain

from django.db import connection, connections, transaction
from django.db.models import DateTimeField, Field, ForeignObject, JSONField, Lookup
from psycopg.adapt import Dumper
from psycopg.pq import Format


def is_postgresql():
    return connection.vendor == "postgresql"


class JsonText(str):
    """A JSON column's value already encoded (json.dumps of it). The caller often has the text at hand;
    encoding the value again per row (and decoding it for the ORM's fallback) cost as much as the COPY."""


def _instances(model, fields, rows):
    """Model instances for the ORM's fallback: JsonText decoded, as the field expects the value."""
    for row in rows:
        values = (json.loads(value) if isinstance(value, JsonText) else value for value in row)
        yield model(**dict(zip(fields, values, strict=True)))


def insert_rows(model, fields, rows, batch_size=2000):
    """Insert `rows` (tuples of values in `fields` order; foreign keys by their `_id` attname); returns
    how many. `rows` may be a generator: on PostgreSQL it is consumed as the COPY goes, so the server
    inserts the rows already sent while the generator makes the next ones."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return 0
    rows = chain((first,), rows)
    if not is_postgresql():
        rows = list(rows)
        model.objects.bulk_create(_instances(model, fields, rows), batch_size=batch_size)
        return len(rows)
    meta = model._meta
    model_fields = [meta.get_field(name) for name in _field_names(fields)]
    columns = ", ".join(connection.ops.quote_name(field.column) for field in model_fields)
    types = binary_types(model_fields)
    binary = " (FORMAT BINARY)" if types else ""
    sql = f"COPY {connection.ops.quote_name(meta.db_table)} ({columns}) FROM STDIN{binary}"
    connection.ensure_connection()
    with connection.wrap_database_errors, connection.connection.cursor() as cursor:
        json_columns = [index for index, name in enumerate(types or ()) if name in JSON_TYPES]
        if json_columns:
            # COPY's set_types picks each column's dumper by its type's oid: both stand ready.
            cursor.adapters.register_dumper(JsonText, JsonTextBinaryDumper)
            cursor.adapters.register_dumper(JsonText, JsonbTextBinaryDumper)
        count = 0
        with cursor.copy(sql) as copy:
            if types:
                copy.set_types(types)
            for row in rows:
                if json_columns:
                    row = _json_as_text(row, json_columns)
                copy.write_row(row)
                count += 1
    return count


class JsonbTextBinaryDumper(Dumper):
    """JsonText into a binary jsonb field: the format's version byte, then the text as it is. Registered
    on the COPY's cursor only, where it stands in for psycopg's jsonb dumper (which would encode the
    string again as a JSON string)."""

    format = Format.BINARY
    oid = 3802  # jsonb, a built-in type: its oid is fixed

    def dump(self, obj):
        return b"\x01" + obj.encode()


class JsonTextBinaryDumper(Dumper):
    """JsonText into a binary json field (broker.workloads.fields.StoredJSONField): json's binary form is
    its text."""

    format = Format.BINARY
    oid = 114  # json

    def dump(self, obj):
        return obj.encode()


def _json_as_text(row, json_columns):
    """JSON values as JsonText (encoded here if the caller had not), as the binary jsonb dumper takes."""
    if all(row[index] is None or type(row[index]) is JsonText for index in json_columns):
        return row
    row = list(row)
    for index in json_columns:
        if row[index] is not None and type(row[index]) is not JsonText:
            row[index] = JsonText(json.dumps(row[index], default=str))
    return row


# Column types (as Django declares them on PostgreSQL) that binary COPY takes straight from the Python
# values the cycle holds: ints, strings, aware datetimes, booleans, floats.
BINARY_TYPES = {
    "bigint": "int8",
    "integer": "int4",
    "smallint": "int2",
    "varchar": "text",
    "text": "text",
    "timestamp with time zone": "timestamptz",
    "boolean": "bool",
    "double precision": "float8",
    "jsonb": "jsonb",  # JsonText (or a value encoded here), see JsonbTextBinaryDumper
    "json": "json",  # the same, see JsonTextBinaryDumper
}
JSON_TYPES = {"json", "jsonb"}


def binary_types(fields):
    """psycopg type names for a binary COPY of these columns, or None when one has no plain binary
    form here (JSON, numeric, ...): binary COPY skips the server's text parsing and psycopg's text
    formatting of every value (a third of the time for 100k allocation rows)."""
    types = []
    for field in fields:
        declared = field.db_type(connection) or ""
        name = BINARY_TYPES.get(declared.split("(", 1)[0].strip().lower())
        if name is None:
            return None
        types.append(name)
    return types


def upsert_rows(model, fields, rows, unique_fields, update_fields, batch_size=2000):
    """Insert `rows` (as for insert_rows); where a row with the same `unique_fields` exists, set its
    `update_fields` instead. What is stored is what bulk_create(update_conflicts=True) would store: each
    JSON and datetime value goes through its field's get_db_prep_save."""
    rows = list(rows)
    if not rows:
        return 0
    if not is_postgresql():
        model.objects.bulk_create(
            _instances(model, fields, rows),
            batch_size=batch_size,
            update_conflicts=True,
            unique_fields=_field_names(unique_fields),
            update_fields=_field_names(update_fields),
        )
        return len(rows)
    meta = model._meta
    quote = connection.ops.quote_name
    model_fields = [meta.get_field(name) for name in _field_names(fields)]
    columns = ", ".join(quote(f.column) for f in model_fields)
    conflict = ", ".join(quote(meta.get_field(name).column) for name in _field_names(unique_fields))
    updates = ", ".join(
        f"{quote(column)} = EXCLUDED.{quote(column)}"
        for column in (meta.get_field(name).column for name in _field_names(update_fields))
    )
    table = quote(meta.db_table)
    temporary = quote(f"upsert_{meta.db_table}")
    # Only the needed columns, their types and nothing else: no defaults, no NOT NULL, no sequence.
    create = f"CREATE TEMPORARY TABLE {temporary} ON COMMIT DROP AS SELECT {columns} FROM {table} WITH NO DATA"
    merge = (
        f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {temporary} "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {updates}"
    )
    prepare = [_preparation(f) for f in model_fields]
    # atomic: one transaction (or savepoint) for the table's life; a failure rolls its creation back.
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(create)
        with connection.wrap_database_errors, cursor.cursor.copy(f"COPY {temporary} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([v if prep is None else prep(v) for prep, v in zip(prepare, row, strict=True)])
        cursor.execute(merge)
        cursor.execute(f"DROP TABLE {temporary}")
    return len(rows)


def update_rows(model, fields, rows, batch_size=5000):
    """Set `fields` (attribute names: "evicted_for_id") of the rows whose primary keys come first in
    `rows` ((pk, value, ...)). On PostgreSQL one UPDATE joined to the values passed as one array per
    column: bulk_update writes each column as a CASE over the batch's pks, which the server walks for
    every row (quadratic: 348 workloads took ~0.35 s) and Django compiles When by When. Elsewhere
    bulk_update in batches. Not for JSON columns."""
    rows = list(rows)
    if not rows:
        return 0
    meta = model._meta
    model_fields = [meta.get_field(name) for name in _field_names(fields)]
    if any(isinstance(field, JSONField) for field in model_fields):
        raise ValueError("update_rows does not write JSON columns")
    if not is_postgresql():
        instances = [model(pk=row[0], **dict(zip(fields, row[1:], strict=True))) for row in rows]
        model.objects.bulk_update(instances, [field.name for field in model_fields], batch_size=batch_size)
        return len(rows)
    quote = connection.ops.quote_name
    pk = meta.pk
    typed = [(pk.column, pk.cast_db_type(connection)), *((f.column, f.cast_db_type(connection)) for f in model_fields)]
    arrays = ", ".join(f"%s::{db_type}[]" for _, db_type in typed)
    names = ", ".join(f"v_{index}" for index in range(len(typed)))
    sets = ", ".join(f"{quote(column)} = v.v_{index}" for index, (column, _) in enumerate(typed) if index)
    table = quote(meta.db_table)
    sql = f"UPDATE {table} SET {sets} FROM unnest({arrays}) AS v({names}) WHERE {table}.{quote(pk.column)} = v.v_0"
    prepare = [None, *(_preparation(field) for field in model_fields)]
    with connection.cursor() as cursor:
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            columns = [
                [value if prep is None else prep(value) for value in column]
                for prep, column in zip(prepare, zip(*batch, strict=True), strict=True)
            ]
            cursor.execute(sql, columns)
    return len(rows)


def _preparation(field):
    """What a value for `field` goes through before the COPY (None: nothing). JSON (to psycopg's Jsonb,
    dumped as the ORM dumps it; JsonText as it is: the server parses the text) and naive datetimes (made
    aware as the ORM does) go through their field's preparation; aware datetimes and other values pass
    as given, already of the column's Python type."""
    # The wrapper itself, not the thread-local proxy: looked up once, not per value.
    prep = partial(field.get_db_prep_save, connection=connections[connection.alias])
    if isinstance(field, JSONField):
        return lambda value: value if isinstance(value, JsonText) else prep(value)
    if isinstance(field, DateTimeField):
        return lambda value: value if value is None or getattr(value, "tzinfo", None) is not None else prep(value)
    return None


def _field_names(fields):
    # "workload_id" -> "workload": get_field wants the field name, the COPY wants its column.
    return [name[:-3] if name.endswith("_id") else name for name in fields]


class IdArray:
    """The ids of an `any_of` lookup, made into PostgreSQL's array text once. Not a list on purpose:
    Django walks a list or tuple lookup value element by element to resolve expressions in it (0.15 s
    for the 65,000 device ids an admission checks); this passes through as one value."""

    __slots__ = ("text", "count")

    def __init__(self, ids):
        ids = [int(value) for value in ids]
        self.text = "{" + ",".join(map(str, ids)) + "}"
        self.count = len(ids)

    def __len__(self):
        return self.count


class AnyOf(Lookup):
    """`column = ANY(%s::bigint[])`: one array parameter; PostgreSQL probes the index once per id or
    hashes the array, whatever it believes about the other conditions. The array goes as its text
    ('{1,2,3}'), one string to quote: psycopg adapting a list of 20,000 ints element by element took
    15 ms per query."""

    lookup_name = "any_of"
    prepare_rhs = False

    def get_prep_lookup(self):
        return self.rhs if isinstance(self.rhs, IdArray) else IdArray(self.rhs)

    def as_sql(self, compiler, connection):
        lhs, params = self.process_lhs(compiler, connection)
        return f"{lhs} = ANY(%s::bigint[])", [*params, self.rhs.text]


Field.register_lookup(AnyOf)
ForeignObject.register_lookup(AnyOf)  # relations keep lookups of their own


def pk_in(ids):
    """Keyword filter: primary key in `ids`, e.g. `Workload.objects.filter(**pk_in(ids))`."""
    if not is_postgresql():
        return {"pk__in": list(ids)}
    return {"pk__any_of": IdArray(ids)}


def column_in(field_name, ids):
    """Keyword filter: `field_name` (a foreign key, by field name) in `ids`."""
    if not is_postgresql():
        return {f"{field_name}__in": list(ids)}
    return {f"{field_name}__any_of": IdArray(ids)}


class Background:
    """Database work that runs while this thread goes on with Python work. The cycle's commit spends
    most of its time waiting for PostgreSQL (a 20,000-row UPDATE rewrites every index entry of every
    row) while one core sits idle, then most of the rest building the next rows while PostgreSQL waits:
    with two cores, both can happen at once. On PostgreSQL `work(cursor)` runs on a raw cursor of this
    thread's connection in a helper thread; this thread must not use the connection until `result()`
    (psycopg's connection lock would make it wait for the work anyway, never interleave). Django's query
    wrappers do not see the work's statements. Elsewhere (SQLite) the work runs at once, here, on a
    Django cursor.

    Always call `result()` (or `wait()` on the way out of an error): the work belongs to the caller's
    transaction, and that transaction must not end, nor the connection be used, while it runs.

    `after`: an earlier Background this work waits for (works sent one after another run in the order
    sent). If that one failed, this one does not run: the transaction is aborted, and the earlier
    error is the one to report."""

    def __init__(self, work, after=None):
        self._error = None
        self._failed = False
        self._value = None
        self._thread = None
        self._after = after
        if not is_postgresql():
            with connection.cursor() as cursor:
                self._value = work(cursor)
            return
        connection.ensure_connection()
        raw = connection.connection
        self._thread = threading.Thread(target=self._run, args=(work, raw), name="cycle-background", daemon=True)
        self._thread.start()

    @classmethod
    def finished(cls, value):
        """Work already done here, as a Background: `result()` gives `value`."""
        work = cls.__new__(cls)
        work._error, work._failed, work._value, work._thread, work._after = None, False, value, None, None
        return work

    def _run(self, work, raw):
        after = self._after
        self._after = None  # a chain of them must not keep every earlier one alive
        if after is not None:
            after.wait()
            if after.failed:
                self._failed = True
                return
        try:
            with raw.cursor() as cursor:
                self._value = work(cursor)
        except BaseException as error:  # handed to result(), in the thread that owns the transaction
            self._error = error
            self._failed = True

    @property
    def failed(self):
        """Whether the work has ended in an error (or did not run, after an earlier one's error)."""
        return self.done and self._failed

    @property
    def done(self):
        """Whether the work has ended."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self):
        """Wait until the work has ended, whatever its outcome."""
        if self._thread is not None:
            self._thread.join()

    def result(self):
        """The work's return value, once it has ended; its error, as Django's, if it failed."""
        self.wait()
        if self._error is not None:
            error, self._error = self._error, None
            with connection.wrap_database_errors:
                raise error
        return self._value
