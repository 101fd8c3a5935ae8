"""Aggregates in PostgreSQL (psycopg 3): ``postgresql://USER@HOST:PORT/DB[?options=...]``.

Guarantee: a micro-batch's upserts and marker commit in one transaction, durable on return (the
server's commit; ``synchronous_commit`` as configured). Rows reach the server by ``COPY`` into a
temporary staging table (one per aggregate table and session, emptied at commit), then one
``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` per table. PostgreSQL cuts identifiers at 63 bytes,
so a staging table is named from a hash of its table's whole name (:func:`stage_name`): two tables
that share their first 56 characters never share a staging table. Table and column names are at
most 63 bytes already (``spec.check_name``); primary-key constraints are named by PostgreSQL, which
makes a cut name unique itself. Sums that are not integers are
``NUMERIC(38,6)``: exact. Tables live in the connection's ``search_path`` (e.g.
``?options=-csearch_path%3Dmyschema``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import psycopg

from exactly.aggregate.base import AggregateDB, Row, quote
from exactly.aggregate.spec import TableSpec

CONNECT_SECONDS = 5
IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are cut, silently


def stage_name(table: str) -> str:
    """The staging table of ``table``: unique per table name and within PostgreSQL's 63 bytes."""
    digest = hashlib.sha256(table.encode()).hexdigest()[:16]
    return f"_stage_{table[:39]}_{digest}"  # 7 + 39 + 1 + 16 = 63 (names are ASCII)


class PostgresDB(AggregateDB):
    """Aggregate tables in PostgreSQL; see the module docstring for the guarantee."""

    placeholder = "%s"
    time_type = "TIMESTAMP"

    def describe(self) -> str:
        return self.url.split("@", 1)[-1].split("?", 1)[0]  # no password in messages

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url, connect_timeout=CONNECT_SECONDS)

    def _transient(self, error: BaseException) -> bool:
        if isinstance(error, psycopg.errors.InvalidCatalogName | psycopg.errors.InvalidPassword):
            return False
        return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)

    def _begin(self, cursor: Any) -> None:
        pass  # psycopg opens a transaction with the first statement

    def _upsert(self, cursor: Any, spec: TableSpec, rows: Sequence[Row]) -> None:
        stage = quote(stage_name(spec.name))
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {quote(spec.name)}) "
            "ON COMMIT DELETE ROWS"
        )
        columns = ", ".join(quote(c) for c in spec.columns)
        with cursor.copy(f"COPY {stage} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        cursor.execute(self.upsert_sql(spec, stage))

    def _existing_columns(self, cursor: Any, table: str) -> list[str] | None:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema() ORDER BY ordinal_position",
            (table,),
        )
        columns = [str(row[0]) for row in cursor.fetchall()]
        return columns or None

    def time_bucket(self, column: str, unit: str) -> str:
        return f"to_char(date_trunc('{unit}', {column}), 'YYYY-MM-DD HH24:MI:SS')"
