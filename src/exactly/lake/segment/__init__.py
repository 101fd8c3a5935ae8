"""The segment layout: Segment's warehouse tables beside ``events`` (issue 42), as pure logic.

Given a micro-batch of events and the columns each table has, :func:`shape` gives each table's
rows as Arrow with the columns to add, the kinds to widen and the values kept in ``_rejected``;
:mod:`~exactly.lake.segment.users` merges ``users`` and ``accounts``. Nothing here touches
Spark or a table backend: they call this and commit what it gives. The rules, one module each:

* :mod:`~exactly.lake.segment.names`: snake case, flattening, reserved and colliding names, long
  names, event tables;
* :mod:`~exactly.lake.segment.kinds`: a column's kind, widening, what fits;
* :mod:`~exactly.lake.segment.limits`: the most tables, columns and name bytes;
* :mod:`~exactly.lake.segment.table`: one table's rows typed, rejects counted;
* :mod:`~exactly.lake.segment.shape`: the events as rows of each table;
* :mod:`~exactly.lake.segment.users`: newest traits per user and per group.
"""

from __future__ import annotations

from exactly.lake.segment.limits import Limits
from exactly.lake.segment.names import BUILT_IN_TABLES, event_table, flatten, snake
from exactly.lake.segment.shape import Shaped, day_of, own_columns, shape, tables_of
from exactly.lake.segment.table import TableBatch, schema_kinds
from exactly.lake.segment.users import (
    MERGED,
    Merged,
    Profile,
    merge,
    merge_all,
    merged_key,
    profile_of_row,
    profile_rows,
    profiles,
    rows_of,
)

__all__ = [
    "BUILT_IN_TABLES",
    "MERGED",
    "Limits",
    "Merged",
    "Profile",
    "Shaped",
    "TableBatch",
    "day_of",
    "event_table",
    "flatten",
    "merge",
    "merge_all",
    "merged_key",
    "own_columns",
    "profile_of_row",
    "profile_rows",
    "profiles",
    "rows_of",
    "schema_kinds",
    "shape",
    "snake",
    "tables_of",
]
