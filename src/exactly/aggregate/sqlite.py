"""Aggregates in one SQLite file: the embedded default, ``sqlite:///FILE`` (or ``sqlite://REL``).

Guarantee: a micro-batch's upserts and marker commit in one transaction, durable on return (WAL
with ``synchronous=FULL``: the commit is fsynced). One writer at a time (``BEGIN IMMEDIATE``
takes SQLite's write lock; a reader never blocks it in WAL mode). Sums that are not integers are
stored as REAL (SQLite has no exact decimal): each micro-batch adds its exact decimal sum, so the
error stays within a few units in the 15th significant digit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from exactly.aggregate.base import AggregateDB, Row, quote
from exactly.aggregate.spec import TableSpec
from exactly.errors import ConfigError

BUSY_SECONDS = 5.0


def sqlite_path(url: str) -> Path:
    """``sqlite:///abs/file.db`` or ``sqlite://rel/file.db`` to a path."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    if not rest or rest == "/":
        raise ConfigError(f"aggregate database URL {url!r}: name a file, sqlite:///path/file.db")
    return Path(rest)


class SQLiteDB(AggregateDB):
    """Aggregate tables in a SQLite file; see the module docstring for the guarantee."""

    decimal_type = "REAL"
    count_type = "INTEGER"

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.path = sqlite_path(url)

    def describe(self) -> str:
        return f"sqlite file {self.path}"

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        return connection

    def _transient(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.OperationalError) and any(
            word in str(error) for word in ("locked", "busy", "unable to open", "disk I/O")
        )

    def _begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN IMMEDIATE")

    def _upsert(self, cursor: Any, spec: TableSpec, rows: Sequence[Row]) -> None:
        cursor.executemany(self.upsert_sql(spec), rows)

    def _adapt(self, spec: TableSpec, rows: Sequence[Row]) -> Sequence[Row]:
        decimals = [len(spec.keys) + i for i, m in enumerate(spec.measures) if m.kind == "decimal"]
        if not decimals:
            return rows
        return [tuple(float(v) if i in decimals else v for i, v in enumerate(row)) for row in rows]

    def _existing_columns(self, cursor: Any, table: str) -> list[str] | None:
        cursor.execute(f"PRAGMA table_info({quote(table)})")
        columns = [str(row[1]) for row in cursor.fetchall()]
        return columns or None
