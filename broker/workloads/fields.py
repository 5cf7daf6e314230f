"""Model fields of the workloads app."""

from django.db import models


class StoredJSONField(models.JSONField):
    """A JSON value kept as written: PostgreSQL's `json` (the text, validated) rather than `jsonb` (parsed
    into its binary form on every write). For documents written by the thousand and only ever read back
    whole: a refill cycle writes 17,000 explanations, and parsing their details as jsonb was a third of
    the server's time for that COPY. Not for filtering (`details__quota__queue=...`, `__contains`): `json`
    has no equality or containment operators. Elsewhere (SQLite) it is the ordinary JSONField."""

    description = "A JSON value stored as its text"

    def db_type(self, connection):
        return "json" if connection.vendor == "postgresql" else super().db_type(connection)

    def select_format(self, compiler, sql, params):
        # Read as text, as Django reads jsonb, and decoded by from_db_value: psycopg's own json loader
        # would hand back a JSON string ("[1]") as a str that from_db_value then decodes a second time.
        sql, params = super().select_format(compiler, sql, params)
        if compiler.connection.vendor == "postgresql":
            return f"({sql})::text", params
        return sql, params
