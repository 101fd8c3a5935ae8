"""A warehouse table in PostgreSQL: ``postgresql://USER@HOST[:PORT]/DB?table=events``.

Other query options are libpq's (``sslmode``, ``options=-csearch_path=...``). Rows are loaded
with ``COPY``; the marker is a row of ``exactly_lake_batches`` (table, query id, last batch id,
its end offsets).
Per batch, one SQL transaction:

1. an advisory lock on (table, query), then the marker read: a batch at or below it is a
   replay, and the transaction ends with nothing written;
2. ``ALTER TABLE ... ADD COLUMN`` for the batch's new columns (older rows read null), and
   ``ALTER COLUMN ... TYPE double precision`` for a bigint column the batch holds as double
   (the segment layout's widening: :attr:`PostgresTable.can_widen`);
3. ``COPY`` of the rows; with a key (``users``, ``accounts``: their primary key), ``COPY`` into
   a temporary table and ``INSERT ... ON CONFLICT (key) DO UPDATE`` every column from it;
4. the marker upserted; then ``COMMIT``.

A sibling (:meth:`~PostgresTable.sibling`, the segment layout's tables) is the table of that
name in the same schema, on the same connection (its transactions one after another); the
siblings listed are those with a batch in ``exactly_lake_batches``, so that other tables of the
schema (the aggregates) are none of the layout's.

Guarantee: each batch's rows are in the table exactly once, even with concurrent writers of the
same query (the lock and the marker are checked inside the transaction). A killed batch is
rolled back by the server: there are no files to vacuum, and a table of rows needs no
compaction, so :meth:`optimize`, :meth:`vacuum` and :meth:`expire` do nothing.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode

import psycopg
import pyarrow as pa  # type: ignore[import-untyped]
from psycopg import sql

from exactly.errors import LakeError
from exactly.forget.regulations import Forgotten
from exactly.lake.base import Compaction, LakeTable, Marker, end_offsets_from
from exactly.lake.columns import BASE_SCHEMA, UTC_TIME
from exactly.urls import redact

MARKERS = "exactly_lake_batches"
MERGING = "exactly_merging"  # the temporary table a keyed commit copies into
SQL_TYPES = {  # Arrow type -> PostgreSQL type
    pa.string(): "text",
    pa.large_string(): "text",
    pa.string_view(): "text",
    UTC_TIME: "timestamptz",
    pa.date32(): "date",
    pa.float64(): "double precision",
    pa.int64(): "bigint",
    pa.bool_(): "boolean",
}
ARROW_TYPES = {  # information_schema's data_type -> Arrow type
    "text": pa.string(),
    "timestamp with time zone": UTC_TIME,
    "date": pa.date32(),
    "double precision": pa.float64(),
    "bigint": pa.int64(),
    "boolean": pa.bool_(),
}


class PostgresTable(LakeTable):
    """A table of events in PostgreSQL (module docstring: the protocol and the guarantee)."""

    can_widen = True
    parallel_commits = False  # siblings share one connection

    def __init__(
        self,
        conninfo: str,
        table: str = "events",
        url: str = "",
        *,
        base: pa.Schema = BASE_SCHEMA,
        shared: psycopg.Connection[Any] | None = None,
    ) -> None:
        self.table, self.conninfo, self.base = table, conninfo, base
        self.name = table
        self.url = redact(url or conninfo)
        self.owns_connection = shared is None
        if shared is not None:
            self.connection = shared
            return
        try:
            self.connection = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as error:
            first = str(error).strip().splitlines()[0]
            raise LakeError(f"lake table {self.url}: cannot connect ({first})") from error
        self._ensure_markers()

    @classmethod
    def from_url(cls, url: str) -> PostgresTable:
        base, _, query = url.partition("?")
        options = parse_qsl(query)
        table = dict(options).get("table", "events")
        rest = [(key, value) for key, value in options if key != "table"]
        conninfo = base + (f"?{urlencode(rest)}" if rest else "")
        return cls(conninfo, table, url)

    def sibling(self, name: str) -> PostgresTable:
        base, _, query = self.url.partition("?")
        options = [(k, v) for k, v in parse_qsl(query) if k != "table"]
        url = f"{base}?{urlencode([*options, ('table', name)])}"
        return PostgresTable(self.conninfo, name, url, base=pa.schema([]), shared=self.connection)

    def siblings(self) -> list[str]:
        """The tables of the schema that hold a batch: the schema may hold other tables too (the
        aggregates beside a lake table), which are no siblings."""
        rows = self.connection.execute(
            sql.SQL(
                "SELECT DISTINCT m.table_name FROM {} m JOIN information_schema.tables t"
                " ON t.table_name = m.table_name AND t.table_schema = current_schema()"
                " ORDER BY 1"
            ).format(sql.Identifier(MARKERS))
        ).fetchall()
        return [str(row[0]) for row in rows]

    def _ensure_markers(self) -> None:
        self.connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (table_name text NOT NULL, query_id text NOT NULL,"
                " batch_id bigint NOT NULL, end_offsets text,"
                " committed_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (table_name, query_id))"
            ).format(sql.Identifier(MARKERS))
        )

    def committed(self, query_id: str) -> int | None:
        row = self.connection.execute(
            sql.SQL("SELECT batch_id FROM {} WHERE table_name = %s AND query_id = %s").format(
                sql.Identifier(MARKERS)
            ),
            (self.table, query_id),
        ).fetchone()
        return None if row is None else int(row[0])

    def end_offsets(self) -> dict[int, int] | None:
        row = self.connection.execute(
            sql.SQL(
                "SELECT end_offsets FROM {} WHERE table_name = %s AND end_offsets IS NOT NULL"
                " ORDER BY committed_at DESC LIMIT 1"
            ).format(sql.Identifier(MARKERS)),
            (self.table,),
        ).fetchone()
        return None if row is None else end_offsets_from(row[0])

    def schema(self) -> pa.Schema | None:
        rows = self.connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = %s AND table_schema = current_schema() ORDER BY ordinal_position",
            (self.table,),
        ).fetchall()
        if not rows:
            return None
        return pa.schema([(name, ARROW_TYPES[kind]) for name, kind in rows])

    def commit_shaped(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        """The marker read inside the transaction only (step 1 there)."""
        return self.commit(rows, marker, key=key)

    def commit(self, rows: pa.Table, marker: Marker, *, key: str | None = None) -> bool:
        table = sql.Identifier(self.table)
        with self.connection.transaction():
            cursor = self.connection.cursor()
            # 1. lock, then the marker
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"{self.table} {marker.query_id}",),
            )
            last = self.committed(marker.query_id)
            if last is not None and marker.batch_id <= last:
                return False
            # 2. the table, its new columns and its widened ones
            self._evolve(cursor, rows.schema, key)
            # 3. the rows
            names = sql.SQL(", ").join(sql.Identifier(name) for name in rows.column_names)
            into = table if key is None else sql.Identifier(MERGING)
            if key is not None:
                cursor.execute(
                    sql.SQL("CREATE TEMPORARY TABLE {} (LIKE {}) ON COMMIT DROP").format(
                        into, table
                    )
                )
            with cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(into, names)) as copy:
                for row in _rows(rows):
                    copy.write_row(row)
            if key is not None:
                cursor.execute(_upsert(self.table, rows.column_names, key))
            # 4. the marker
            cursor.execute(
                sql.SQL(
                    "INSERT INTO {} (table_name, query_id, batch_id, end_offsets)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (table_name, query_id) DO UPDATE"
                    " SET batch_id = EXCLUDED.batch_id, end_offsets = EXCLUDED.end_offsets,"
                    " committed_at = clock_timestamp()"
                ).format(sql.Identifier(MARKERS)),
                (self.table, marker.query_id, marker.batch_id, marker.end_text),
            )
        return True

    def _evolve(self, cursor: psycopg.Cursor[Any], schema: pa.Schema, key: str | None) -> None:
        """Step 2: the table created (``key`` its primary key), ``schema``'s new columns added
        and its doubles that the table holds as bigint widened."""
        table = sql.Identifier(self.table)
        known = self.schema()
        if known is None:
            columns = [_column(field) for field in schema]
            if key is not None:
                columns.append(sql.SQL("PRIMARY KEY ({})").format(sql.Identifier(key)))
            cursor.execute(
                sql.SQL("CREATE TABLE {} ({})").format(table, sql.SQL(", ").join(columns))
            )
            return
        for field in schema:
            if field.name not in known.names:
                cursor.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {}").format(table, _column(field))
                )
            elif pa.types.is_integer(known.field(field.name).type) and pa.types.is_floating(
                field.type
            ):
                cursor.execute(
                    sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE double precision").format(
                        table, sql.Identifier(field.name)
                    )
                )

    def lookup(self, key: str, values: Sequence[str]) -> pa.Table:
        schema = self.schema()
        if schema is None or not values or key not in schema.names:
            return self.base.empty_table()
        names = sql.SQL(", ").join(sql.Identifier(name) for name in schema.names)
        rows = self.connection.execute(
            sql.SQL("SELECT {} FROM {} WHERE {} = ANY(%s)").format(
                names, sql.Identifier(self.table), sql.Identifier(key)
            ),
            (list(values),),
        ).fetchall()
        return pa.Table.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in rows], schema
        )

    def read(self) -> pa.Table:
        schema = self.schema()
        if schema is None:
            return self.base.empty_table()
        names = sql.SQL(", ").join(sql.Identifier(name) for name in schema.names)
        rows = self.connection.execute(
            sql.SQL("SELECT {} FROM {}").format(names, sql.Identifier(self.table))
        ).fetchall()
        return pa.Table.from_pylist(
            [dict(zip(schema.names, row, strict=True)) for row in rows], schema
        )

    def rows(self) -> int:
        if self.schema() is None:
            return 0
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.table))
        row = self.connection.execute(query).fetchone()
        return 0 if row is None else int(row[0])

    def present(self, column: str) -> pa.Array:
        schema = self.schema()
        if schema is None or column not in schema.names:
            return pa.array([], pa.string())
        query = sql.SQL("SELECT {0} FROM {1} WHERE {0} IS NOT NULL").format(
            sql.Identifier(column), sql.Identifier(self.table)
        )
        values = [row[0] for row in self.connection.execute(query).fetchall()]
        return pa.array(values, schema.field(column).type)

    def version(self) -> int | None:
        return None

    def optimize(self) -> Compaction:
        return Compaction(0, 0)

    def vacuum(self, older_than: timedelta) -> list[str]:
        return []

    def expire(self, retention: timedelta) -> int:
        return 0

    def forget(self, forgotten: Forgotten, message_ids: Set[str]) -> int:
        """``DELETE`` the rows, then ``VACUUM`` the table: a deleted row stays in its page
        until vacuum frees it (the server's WAL, archives and backups are the operator's)."""
        found = self.forgotten_ids(forgotten, message_ids)
        deleted = 0
        if found:
            condition = sql.SQL(" OR ").join(
                sql.SQL("{} = ANY(%s)").format(sql.Identifier(column)) for column in sorted(found)
            )
            deleted = self.connection.execute(
                sql.SQL("DELETE FROM {} WHERE ").format(sql.Identifier(self.table)) + condition,
                [list(found[column]) for column in sorted(found)],
            ).rowcount
        # every time: an earlier forget may have been killed between its delete and this
        self.connection.execute(sql.SQL("VACUUM {}").format(sql.Identifier(self.table)))
        return int(deleted or 0)

    def close(self) -> None:
        if self.owns_connection:
            self.connection.close()


def _sql_type(kind: pa.DataType) -> str:
    found = SQL_TYPES.get(kind)
    if found is None and pa.types.is_timestamp(kind):
        found = "timestamptz"
    if found is None:
        raise LakeError(f"a lake column of Arrow type {kind} has no PostgreSQL type")
    return found


def _column(field: pa.Field) -> sql.Composable:
    return sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(_sql_type(field.type)))


def _upsert(table: str, columns: Sequence[str], key: str) -> sql.Composed:
    """Every copied row into ``table``, replacing the row of its ``key``."""
    names = sql.SQL(", ").join(sql.Identifier(name) for name in columns)
    updates = sql.SQL(", ").join(
        sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(name), sql.Identifier(name))
        for name in columns
        if name != key
    )
    upsert = "INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO UPDATE SET {}"
    return sql.SQL(upsert).format(
        sql.Identifier(table),
        names,
        names,
        sql.Identifier(MERGING),
        sql.Identifier(key),
        updates,
    )


def _rows(rows: pa.Table) -> Any:
    for batch in rows.to_batches(max_chunksize=10_000):
        columns = [column.to_pylist() for column in batch.columns]
        yield from zip(*columns, strict=True)
