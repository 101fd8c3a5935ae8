"""The aggregate database: tables of additive counts, upserted with a batch marker, exactly once.

The interface every backend implements, composed of three parts, each in a module of its own:

* ``sql.py``: the connection, the backend's hooks (``_connect``, ``_begin``, ``_upsert`` ...),
  retries with backoff on transient errors, plain queries;
* ``tables.py``: the tables a job fills, created once and checked at every start;
* ``commit.py``: the commit protocol of one micro-batch (upserts and marker in one transaction),
  numbered there.

A backend (``sqlite.py``, ``postgres.py``) subclasses :class:`AggregateDB`;
:func:`exactly.aggregate.open_db` picks one by URL.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from exactly.aggregate.commit import KEEP_MARKERS, Batch, CommitProtocol, Marker
from exactly.aggregate.spec import TableSpec
from exactly.aggregate.sql import Row, quote
from exactly.aggregate.tables import TableChecks

__all__ = ["KEEP_MARKERS", "AggregateDB", "Batch", "Marker", "Row", "normalise_row", "quote"]


class AggregateDB(CommitProtocol, TableChecks):
    """A SQL database holding aggregate tables; ``commit.py`` states the guarantee.

    Assumes one writer per table (``prepare`` checks that the tables belong to the checkpoint
    of the job that opens them) and a database that makes a commit durable before it returns.
    Backends supply the connection, the column types and the bulk upsert.
    """

    def table_rows(self, spec: TableSpec) -> list[Row]:
        """Every row of a table as (keys as text, measures as int or Decimal)."""
        columns = ", ".join(quote(c) for c in spec.columns)
        return [
            normalise_row(spec, row)
            for row in self.query(f"SELECT {columns} FROM {quote(spec.name)}")
        ]

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
