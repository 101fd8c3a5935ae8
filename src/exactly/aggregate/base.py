"""The aggregate database: tables of additive counts, upserted with a batch marker, exactly once.

Every backend keeps, beside the aggregate tables,

* ``exactly_batches(query_id, batch_id, checkpoint, topic, end_offsets, events, committed_at)``:
  one marker per micro-batch counted, written in the same transaction as its upserts;
* ``exactly_tables(name, definition, checkpoint, created_at)``: what each table counts and which
  job (by its checkpoint) fills it, so a changed definition or a second job is refused at start.

The commit protocol of one micro-batch (:meth:`AggregateDB.commit`), in one SQL transaction:

1. begin (SQLite: ``BEGIN IMMEDIATE``, the writer lock);
2. look for the marker ``(query id, batch id)``: found means this batch was counted before (Spark
   replays the last batch it did not commit), so roll back and change nothing;
3. upsert every table's rows: ``INSERT ... ON CONFLICT (keys) DO UPDATE SET m = t.m + excluded.m``;
4. insert the marker, with the batch's end offsets in the topic;
5. commit. Only then may Spark commit the batch in its checkpoint.

A crash before 5 leaves nothing; after 5 and before Spark's commit, the replay stops at 2. A lost
connection during 5 leaves the outcome unknown, and the retry settles it at 2. Transient errors
(the server down, the file locked) are retried with backoff for ``retry_seconds``.
"""

from __future__ import annotations

import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from exactly.aggregate.spec import (
    BATCHES_TABLE,
    TABLES_TABLE,
    TableSpec,
)
from exactly.errors import ConfigError, DatabaseUnavailable
from exactly.urls import redact

T = TypeVar("T")
Row = tuple[Any, ...]
KEEP_MARKERS = 1000  # per query: Spark replays only its last batch; older markers are history


@dataclass(frozen=True)
class Batch:
    """One micro-batch's result: rows per table (keys then measures, in the spec's order)."""

    query_id: str
    batch_id: int
    checkpoint: str
    topic: str
    end_offsets: dict[int, int] | None
    rows: dict[str, list[Row]]
    events: int


@dataclass(frozen=True)
class Marker:
    query_id: str
    batch_id: int
    end_offsets: dict[int, int] | None
    events: int
    committed_at: str


def quote(name: str) -> str:
    return f'"{name}"'


class AggregateDB(ABC):
    """A SQL database holding aggregate tables; see the module docstring for the guarantee.

    Assumes one writer per table (``prepare`` checks that the tables belong to the checkpoint
    of the job that opens them) and a database that makes a commit durable before it returns.
    Backends supply the connection, the column types and the bulk upsert.
    """

    placeholder = "?"
    text_type = "TEXT"
    time_type = "TEXT"
    count_type = "BIGINT"
    decimal_type = "NUMERIC(38,6)"

    def __init__(
        self,
        url: str,
        *,
        retry_seconds: float = 600.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.url = url
        self.retry_seconds = retry_seconds
        self.say = say or (lambda _line: None)
        self._connection: Any = None

    # -- what a backend implements -------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection, outside any transaction."""

    @abstractmethod
    def _transient(self, error: BaseException) -> bool:
        """Whether ``error`` means the database is unavailable for now (retry), not a bug."""

    @abstractmethod
    def _begin(self, cursor: Any) -> None:
        """Start a write transaction."""

    @abstractmethod
    def _upsert(self, cursor: Any, spec: TableSpec, rows: Sequence[Row]) -> None:
        """Add ``rows`` to the table: new groups inserted, existing ones added to."""

    @abstractmethod
    def _existing_columns(self, cursor: Any, table: str) -> list[str] | None:
        """The table's column names in order, or None when it does not exist."""

    def _adapt(self, spec: TableSpec, rows: Sequence[Row]) -> Sequence[Row]:
        """Rows as the driver takes them (SQLite: decimals as floats)."""
        return rows

    def describe(self) -> str:
        """The database for messages: never its password."""
        return redact(self.url)

    # -- shared --------------------------------------------------------------------------

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                self._connection.close()
            self._connection = None

    def __enter__(self) -> AggregateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retrying(self, work: Callable[[Any], T], retry_seconds: float | None = None) -> T:
        """Run ``work(connection)``; on a transient error reconnect and run it again."""
        limit = self.retry_seconds if retry_seconds is None else retry_seconds
        deadline = time.monotonic() + limit
        delay = 0.2
        while True:
            try:
                if self._connection is None:
                    self._connection = self._connect()
                return work(self._connection)
            except Exception as error:
                if not self._transient(error):
                    self._rollback()
                    raise
                self.close()
                first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
                if time.monotonic() + delay > deadline:
                    raise DatabaseUnavailable(
                        f"aggregate database {self.describe()} unavailable for {limit:.0f} s: "
                        f"{first}; the job stopped and resumes exactly where it was when rerun"
                    ) from None
                self.say(f"aggregate database unavailable ({first}); retrying in {delay:.1f} s")
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _rollback(self) -> None:
        if self._connection is not None:
            try:
                self._connection.rollback()
            except Exception:  # noqa: BLE001 (the connection may be gone)
                self.close()

    def _columns_sql(self, spec: TableSpec) -> str:
        columns = [
            f"{quote(k.name)} {self.time_type if k.kind == 'time' else self.text_type} NOT NULL"
            for k in spec.keys
        ] + [
            f"{quote(m.name)} "
            f"{self.decimal_type if m.kind == 'decimal' else self.count_type} NOT NULL DEFAULT 0"
            for m in spec.measures
        ]
        keys = ", ".join(quote(k.name) for k in spec.keys)
        return ", ".join([*columns, f"PRIMARY KEY ({keys})"])

    def upsert_sql(self, spec: TableSpec, source: str | None = None) -> str:
        """The upsert of one table, from VALUES (``source`` None) or from a staging table."""
        table = quote(spec.name)
        columns = ", ".join(quote(c) for c in spec.columns)
        if source is None:
            values = f"VALUES ({', '.join([self.placeholder] * len(spec.columns))})"
        else:
            values = f"SELECT {columns} FROM {source}"
        keys = ", ".join(quote(k.name) for k in spec.keys)
        added = ", ".join(
            f"{quote(m.name)} = {table}.{quote(m.name)} + excluded.{quote(m.name)}"
            for m in spec.measures
        )
        return (
            f"INSERT INTO {table} ({columns}) {values} ON CONFLICT ({keys}) DO UPDATE SET {added}"
        )

    def prepare(self, specs: Sequence[TableSpec], checkpoint: str, fresh: bool) -> None:
        """Create what is missing; refuse a changed table or one another job fills.

        ``fresh``: the job's checkpoint has no batch yet. A table new to a job that already
        counted batches would miss them, so it is refused too.
        """

        def work(connection: Any) -> None:
            cursor = connection.cursor()
            self._begin(cursor)
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {BATCHES_TABLE} (query_id TEXT NOT NULL, "
                "batch_id BIGINT NOT NULL, checkpoint TEXT NOT NULL, topic TEXT NOT NULL, "
                "end_offsets TEXT, events BIGINT NOT NULL, committed_at TEXT NOT NULL, "
                "PRIMARY KEY (query_id, batch_id))"
            )
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {TABLES_TABLE} (name TEXT PRIMARY KEY, "
                "definition TEXT NOT NULL, checkpoint TEXT NOT NULL, created_at TEXT NOT NULL)"
            )
            p = self.placeholder
            cursor.execute(f"SELECT name, definition, checkpoint FROM {TABLES_TABLE}")
            known = {name: (definition, owner) for name, definition, owner in cursor.fetchall()}
            mine = [name for name, (_, owner) in known.items() if owner == checkpoint]
            for spec in specs:
                self._check_table(cursor, spec, known.get(spec.name), checkpoint, fresh, mine)
                if spec.name not in known:
                    cursor.execute(f"CREATE TABLE {quote(spec.name)} ({self._columns_sql(spec)})")
                    cursor.execute(
                        f"INSERT INTO {TABLES_TABLE} VALUES ({p}, {p}, {p}, {p})",
                        (spec.name, spec.definition(), checkpoint, _now()),
                    )
            connection.commit()

        self._retrying(work, min(self.retry_seconds, 30.0))

    def _check_table(
        self,
        cursor: Any,
        spec: TableSpec,
        known: tuple[str, str] | None,
        checkpoint: str,
        fresh: bool,
        mine: list[str],
    ) -> None:
        name = spec.name
        if known is None:
            if self._existing_columns(cursor, name) is not None:
                raise ConfigError(
                    f"aggregate table {name!r} exists in {self.describe()} but exactly did not "
                    "create it: name the table differently, or drop it"
                )
            if not fresh and mine:
                raise ConfigError(
                    f"aggregate table {name!r} is new, but this job (checkpoint {checkpoint}) "
                    "has counted events already, which the new table would miss: count it with "
                    "a new --checkpoint into a new database (--db), or drop the job's tables "
                    f"({', '.join(mine)}) and its checkpoint to recount everything"
                )
            return
        definition, owner = known
        if definition != spec.definition():
            raise ConfigError(
                f"aggregate table {name!r} was created with another definition "
                f"({_summary(definition)}; the config now says {_summary(spec.definition())}): "
                f"give the new definition another table name, or drop table {name} and its row "
                f"in {TABLES_TABLE} and recount with a new --checkpoint"
            )
        if owner != checkpoint:
            raise ConfigError(
                f"aggregate table {name!r} is filled by the job with checkpoint {owner}: run "
                "with that --checkpoint, or use another database (--db) for this one"
            )

    def commit(self, batch: Batch, specs: Sequence[TableSpec]) -> bool:
        """Count one micro-batch exactly once; False when its marker was there (a replay)."""
        p = self.placeholder

        def work(connection: Any) -> bool:
            cursor = connection.cursor()
            # 1. begin
            self._begin(cursor)
            # 2. the marker: a replayed batch changes nothing
            cursor.execute(
                f"SELECT 1 FROM {BATCHES_TABLE} WHERE query_id = {p} AND batch_id = {p}",
                (batch.query_id, batch.batch_id),
            )
            if cursor.fetchone() is not None:
                connection.rollback()
                return False
            # 3. the upserts
            for spec in specs:
                rows = batch.rows.get(spec.name, [])
                if rows:
                    self._upsert(cursor, spec, self._adapt(spec, rows))
            # 4. the marker, with the position reached in the topic
            offsets = None if batch.end_offsets is None else json.dumps(batch.end_offsets)
            cursor.execute(
                f"INSERT INTO {BATCHES_TABLE} VALUES ({', '.join([p] * 7)})",
                (
                    batch.query_id,
                    batch.batch_id,
                    batch.checkpoint,
                    batch.topic,
                    offsets,
                    batch.events,
                    _now(),
                ),
            )
            cursor.execute(
                f"DELETE FROM {BATCHES_TABLE} WHERE query_id = {p} AND batch_id < {p}",
                (batch.query_id, batch.batch_id - KEEP_MARKERS),
            )
            # 5. commit: durable before Spark may commit the batch
            connection.commit()
            return True

        return self._retrying(work)

    def latest_marker(
        self, checkpoint: str | None = None, topic: str | None = None
    ) -> Marker | None:
        """The newest batch counted (by this checkpoint and topic when given)."""
        p = self.placeholder
        where, args = [], []
        if checkpoint is not None:
            where.append(f"checkpoint = {p}")
            args.append(checkpoint)
        if topic is not None:
            where.append(f"topic = {p}")
            args.append(topic)
        clause = f"WHERE {' AND '.join(where)}" if where else ""

        def work(connection: Any) -> Marker | None:
            cursor = connection.cursor()
            if self._existing_columns(cursor, BATCHES_TABLE) is None:
                connection.rollback()
                return None
            cursor.execute(
                f"SELECT query_id, batch_id, end_offsets, events, committed_at FROM "
                f"{BATCHES_TABLE} {clause} ORDER BY committed_at DESC, batch_id DESC LIMIT 1",
                args,
            )
            found = cursor.fetchone()
            connection.rollback()
            if found is None:
                return None
            offsets = None if found[2] is None else json.loads(found[2])
            return Marker(
                found[0],
                int(found[1]),
                None if offsets is None else {int(k): int(v) for k, v in offsets.items()},
                int(found[3]),
                str(found[4]),
            )

        return self._retrying(work, min(self.retry_seconds, 30.0))

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of a read-only query (``?`` placeholders are the backend's)."""

        def work(connection: Any) -> list[Row]:
            cursor = connection.cursor()
            cursor.execute(sql.replace("?", self.placeholder), tuple(args))
            rows = [tuple(row) for row in cursor.fetchall()]
            connection.rollback()
            return rows

        return self._retrying(work, min(self.retry_seconds, 30.0))

    def table_rows(self, spec: TableSpec) -> list[Row]:
        """Every row of a table as (keys as text, measures as int or Decimal)."""
        columns = ", ".join(quote(c) for c in spec.columns)
        return [
            normalise_row(spec, row)
            for row in self.query(f"SELECT {columns} FROM {quote(spec.name)}")
        ]

    def tables(self) -> dict[str, tuple[str, str]]:
        """Registered tables: name -> (definition, checkpoint); empty if none were created."""

        def work(connection: Any) -> dict[str, tuple[str, str]]:
            cursor = connection.cursor()
            if self._existing_columns(cursor, TABLES_TABLE) is None:
                connection.rollback()
                return {}
            cursor.execute(f"SELECT name, definition, checkpoint FROM {TABLES_TABLE}")
            found = {str(n): (str(d), str(c)) for n, d, c in cursor.fetchall()}
            connection.rollback()
            return found

        return self._retrying(work, min(self.retry_seconds, 30.0))

    def time_bucket(self, column: str, unit: str) -> str:
        """SQL for a time column truncated to ``unit`` (minute, hour, day), as text."""
        width = {"minute": 16, "hour": 13, "day": 10}[unit]
        pad = {"minute": ":00", "hour": ":00:00", "day": " 00:00:00"}[unit]
        return f"substr({column}, 1, {width}) || '{pad}'"


def normalise_row(spec: TableSpec, row: Row) -> Row:
    """Keys as text (times ``YYYY-MM-DD HH:MM:SS``), counts as int, sums as int or Decimal."""
    out: list[Any] = []
    for key, value in zip(spec.keys, row, strict=False):
        if isinstance(value, datetime):
            out.append(value.strftime("%Y-%m-%d %H:%M:%S"))
        else:
            out.append("" if value is None and key.kind == "text" else str(value))
    for measure, value in zip(spec.measures, row[len(spec.keys) :], strict=True):
        if measure.kind == "decimal":
            out.append(Decimal(str(value)).quantize(Decimal("0.000001")))
        else:
            out.append(int(value))
    return tuple(out)


def _summary(definition: str) -> str:
    data = json.loads(definition)
    keys = ", ".join(f"{name} = {expr} ({kind})" for name, kind, expr in data["keys"])
    measures = ", ".join(f"{name} = {f}({arg}) ({kind})" for name, kind, f, arg in data["measures"])
    return f"group by {keys}; {measures}"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
