"""The lake's state for ``exactly status``: each table's version and how far behind it is.

The table says how far it has landed: the end offsets committed with its newest batch
(:meth:`~exactly.lake.base.LakeTable.end_offsets`); the lag is what the topic holds beyond them.

With the segment layout, each of Segment's tables beside it (:class:`TableStatus`): its version
(None on PostgreSQL), its rows, how many records of ``events`` the events table holds beyond the
end offsets of the table's own newest batch (``behind``), and its ``_rejected`` values counted
per column (:meth:`~exactly.lake.warehouse.Warehouse.rejects`). A table commits only the batches
that have rows for it, so a table of a rare event is "behind" by the records since its last
event; that is not a row missing (``exactly audit`` recounts the rows). Reading the rejects
reads each table's ``_rejected`` column: the cost grows with the tables and their rejects. Once
the per-event tables reach ``[lake] max_tables``, the events of names with no table are counted
per name from ``tracks``'s ``event`` column (:func:`held_back`; one column of ``tracks`` read,
only then).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.lake.base import LakeTable
from exactly.log import Log

if TYPE_CHECKING:
    from exactly.config import Settings
    from exactly.lake.warehouse import Warehouse

SHOWN = 10  # tables, and rejecting columns, the text shows; --json has every one


@dataclass(frozen=True)
class TableStatus:
    """One table of the segment layout."""

    name: str
    version: int | None  # None: the backend keeps no versions (PostgreSQL)
    rows: int
    landed: int  # records of events its newest batch's end offsets pass (their sum)
    behind: int  # records the events table holds beyond them (module docstring)
    rejected: dict[str, int] = field(default_factory=dict)  # column -> values in _rejected


@dataclass(frozen=True)
class LakeStatus:
    url: str  # secrets masked
    version: int | None  # Delta's version, Iceberg's snapshot id; None: no table yet
    landed: int  # records of the topic the table holds (the sum of its end offsets)
    lag: int | None  # records of the topic not in the table yet; None: unknown topic
    layout: str = "events"
    tables: list[TableStatus] = field(default_factory=list)  # the segment layout's, by name
    held_back: dict[str, int] = field(default_factory=dict)  # name past max_tables -> events


def collect(
    table: LakeTable, log: Log, topic: str = "events", warehouse: Warehouse | None = None
) -> LakeStatus:
    """The status of ``table`` and, given the ``warehouse`` beside it, of each of its tables."""
    from exactly.errors import UnknownTopic

    ends = table.end_offsets() or {}
    landed = sum(ends.values())
    try:
        lag: int | None = sum(
            max(0, end - ends.get(partition, 0))
            for partition, end in log.end_offsets(topic).items()
        )
    except UnknownTopic:
        lag = None
    if warehouse is None:
        return LakeStatus(table.url, table.version(), landed, lag)
    tables = table_statuses(warehouse, ends)
    held = held_back(warehouse, [t.name for t in tables])
    return LakeStatus(table.url, table.version(), landed, lag, "segment", tables, held)


def table_statuses(warehouse: Warehouse, events_ends: dict[int, int]) -> list[TableStatus]:
    """Each table of ``warehouse``, by name, against the events table's end offsets."""
    found = []
    for name in warehouse.tables():
        standing = warehouse.table(name).standing()
        ends = standing.end_offsets or {}
        behind = sum(max(0, end - ends.get(p, 0)) for p, end in events_ends.items())
        landed = sum(ends.values())
        rejected = warehouse.rejects(name)
        found.append(TableStatus(name, standing.version, standing.rows, landed, behind, rejected))
    return found


def held_back(warehouse: Warehouse, names: list[str]) -> dict[str, int]:
    """Per event name whose table ``Limits.tables`` held back, its events in ``tracks`` (by
    slug, most first); nothing to read while the per-event tables are fewer than the limit."""
    from exactly.lake.segment import BUILT_IN_TABLES
    from exactly.lake.sql import run

    per_event = [name for name in names if name not in BUILT_IN_TABLES]
    if len(per_event) < warehouse.limits.tables or "tracks" not in names:
        return {}
    text = "select event, count(*) as n from tracks where event is not null group by 1"
    found = run({"tracks": warehouse.table("tracks")}, text).to_pylist()
    held = {row["event"]: int(row["n"]) for row in found if row["event"] not in per_event}
    return dict(sorted(held.items(), key=lambda item: (-item[1], item[0])))


def read(settings: Settings) -> LakeStatus | None:
    """The lake's status: with a ``[lake] url``, or once the default table exists; with
    ``[lake] layout = "segment"``, every table of the layout too."""
    from exactly.lake.segment import Limits
    from exactly.lake.warehouse import Warehouse
    from exactly.log import open_log

    if not settings.has_lake:
        return None
    limits = Limits(tables=settings.lake.max_tables, columns=settings.lake.max_columns)
    with (
        Warehouse.open(settings.lake_url, limits=limits) as warehouse,
        open_log(settings.log_url, max_record_bytes=settings.log.max_record_bytes) as log,
    ):
        segment = warehouse if settings.lake.layout == "segment" else None
        return collect(warehouse.events, log, warehouse=segment)


def render(status: LakeStatus, data_dir: Path, shown: int = SHOWN) -> str:
    """The section for people, within 80 columns: with the segment layout, the ``shown``
    tables furthest behind (then the largest) and the ``shown`` columns with the most rejected
    values, each list with a count of the rest."""
    from exactly.text import count, fit, place, wrap

    version = "no commit yet" if status.version is None else f"version {status.version}"
    behind = "" if status.lag is None else f", lag {count(status.lag)}"
    lines = [
        fit("lake", place(status.url, data_dir)),
        wrap(f"  {version}: {count(status.landed)} records of events{behind}", "    "),
    ]
    if status.layout == "segment":
        lines += table_lines(status.tables, shown)
    if status.held_back:
        events, names = sum(status.held_back.values()), len(status.held_back)
        lines.append(
            wrap(
                f"  past [lake] max_tables: {count(events)} events of {count(names)} "
                + ("name" if names == 1 else "names")
                + " in tracks alone: "
                + ", ".join(list(status.held_back)[:3])
                + (", ..." if names > 3 else ""),
                "    ",
            )
        )
    return "\n".join(lines)


def table_lines(tables: list[TableStatus], shown: int = SHOWN) -> list[str]:
    """The segment layout's tables and their rejected values, in lines of 80 columns."""
    from exactly.text import count

    rows = sum(t.rows for t in tables)
    lines = [f"  segment layout: {count(len(tables))} tables, {count(rows)} rows"]
    if not tables:
        return lines
    lines.append(f"    {'table':<27} {'version':>19} {'rows':>13} {'behind':>12}")
    first = sorted(tables, key=lambda t: (-t.behind, -t.rows, t.name))[:shown]
    for table in first:
        version = "-" if table.version is None else str(table.version)
        lines.append(
            f"    {_cut(table.name, 27):<27} {version:>19} {count(table.rows):>13}"
            f" {count(table.behind):>12}"
        )
    if len(tables) > shown:
        lines.append(f"    ... and {count(len(tables) - shown)} more tables (--json: every one)")
    rejected = [(n, t.name, c) for t in tables for c, n in t.rejected.items()]
    if rejected:
        total, columns = sum(n for n, _, _ in rejected), len(rejected)
        lines.append(
            f"  values kept in _rejected: {count(total)} in {count(columns)} "
            + ("column" if columns == 1 else "columns")
        )
        top = sorted(rejected, key=lambda r: (-r[0], r[1], r[2]))[:shown]
        for number, table_name, column in top:
            lines.append(f"    {_cut(f'{table_name}.{column}', 60):<60} {count(number):>13}")
        if columns > shown:
            lines.append(f"    ... and {count(columns - shown)} more columns (--json: every one)")
    return lines


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
