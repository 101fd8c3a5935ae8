"""How far the segment layout grows: the most tables, columns per table, bytes per name.

Every track event name is a table, every property a column, so a source that puts ids in event
names (``Ordered Product 15``) or property keys would grow without end. :class:`Limits` bounds it;
what a limit holds back stays in ``events`` (and, for a track, in ``tracks``) and is counted, never
lost:

* ``tables`` (default 500): per-event tables at most, the built-in ones not counted. A batch that
  brings more new event names than there is room for gets tables for the names with the most
  events first (ties: the name first in code-point order); the other names' events go to
  ``tracks`` alone.
* ``columns`` (default 1,000; PostgreSQL stops at 1,600): columns per table at most, its own
  columns counted. New columns are admitted the same way, those with the most values first; a
  value whose column was not admitted is kept in its row's ``_rejected`` under the column's
  name.
* ``name_bytes`` (default 63, PostgreSQL's): the longest table or column name
  (:func:`exactly.lake.segment.names.fit`). Give the strictest backend's: a name never changes
  once a table has it.

Admission counts and sorts, so it does not depend on the order of the batch's rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exactly.errors import ConfigError
from exactly.lake.segment.names import NAME_LIMIT, SHORTEST_LIMIT

TABLES = 500
COLUMNS = 1_000
COLUMNS_AT_LEAST = 32  # a table's own columns and a few of the data's


@dataclass(frozen=True)
class Limits:
    """The layout's limits (module docstring)."""

    tables: int = TABLES
    columns: int = COLUMNS
    name_bytes: int = NAME_LIMIT

    def __post_init__(self) -> None:
        if self.tables < 0:
            raise ConfigError(f"[lake] the most tables is {self.tables}: give 0 or more")
        if self.columns < COLUMNS_AT_LEAST:
            raise ConfigError(
                f"[lake] the most columns per table is {self.columns}: give "
                f"{COLUMNS_AT_LEAST} or more (a table's own columns come first)"
            )
        if self.name_bytes < SHORTEST_LIMIT:
            raise ConfigError(
                f"[lake] the longest name is {self.name_bytes} bytes: give {SHORTEST_LIMIT} or more"
            )


def admit(counts: Mapping[str, int], room: int) -> tuple[list[str], list[str]]:
    """The names of ``counts`` (name -> how many values or events) given room, most first then
    by name, at most ``room`` of them; and the names held back, in the same order."""
    ranked = sorted(counts, key=lambda name: (-counts[name], name))
    room = max(room, 0)
    return ranked[:room], ranked[room:]
