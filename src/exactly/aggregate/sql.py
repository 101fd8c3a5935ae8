"""The connection under every aggregate database: the backend's hooks, retries, plain queries.

A backend supplies a DB-API connection, its column types and its bulk upsert (the ``_``-methods
below). What runs on the connection runs through :meth:`SQLDatabase._retrying`: a transient error
(the server down, the file locked) closes the connection, waits (:func:`exactly.backoff.backoff`,
0.2 s up to 5 s) and runs the work again on a new one, for ``retry_seconds`` at most.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Self, TypeVar

from exactly.aggregate.spec import TableSpec
from exactly.backoff import backoff
from exactly.errors import DatabaseUnavailable
from exactly.urls import redact

T = TypeVar("T")
Row = tuple[Any, ...]
RETRY_MIN = 0.2  # seconds before the first retry
RETRY_MAX = 5.0  # seconds between retries at the most


def quote(name: str) -> str:
    return f'"{name}"'


def utc_now() -> str:
    """Now, as the registry and the markers record it (UTC, microseconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SQLDatabase(ABC):
    """A SQL database reached through one DB-API connection, reopened after transient errors."""

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retrying(self, work: Callable[[Any], T], retry_seconds: float | None = None) -> T:
        """Run ``work(connection)``; on a transient error reconnect and run it again."""
        limit = self.retry_seconds if retry_seconds is None else retry_seconds
        deadline = time.monotonic() + limit
        failures = 0
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
                failures += 1
                delay = backoff(failures, minimum=RETRY_MIN, maximum=RETRY_MAX)
                if time.monotonic() + delay > deadline:
                    raise DatabaseUnavailable(
                        f"aggregate database {self.describe()} unavailable for {limit:.0f} s: "
                        f"{first}; the job stopped and resumes exactly where it was when rerun"
                    ) from None
                self.say(f"aggregate database unavailable ({first}); retrying in {delay:.1f} s")
                time.sleep(delay)

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

    def query(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of a read-only query (``?`` placeholders are the backend's)."""

        def work(connection: Any) -> list[Row]:
            cursor = connection.cursor()
            cursor.execute(sql.replace("?", self.placeholder), tuple(args))
            rows = [tuple(row) for row in cursor.fetchall()]
            connection.rollback()
            return rows

        return self._retrying(work, min(self.retry_seconds, 30.0))
