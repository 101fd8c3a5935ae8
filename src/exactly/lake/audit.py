"""The lake's part of ``exactly audit``: ``events`` recounted per day against the lake table, and
with the segment layout each of Segment's tables too.

The recount is a Spark batch read of the topic up to the end offsets the table committed with its
newest batch (so a lake query that keeps running shows no difference), each record given its day
as the lake query gives it (:func:`~exactly.lake.query.lake_frame`). The table's side is DuckDB
over its current version (:mod:`exactly.lake.sql`). Per day, the rows and the distinct messageIds
must both equal the recount's records: a row missing, a row twice or a row on the wrong day shows.

**The segment layout's tables** (:func:`audit_tables`). Each table commits only the batches that
have rows for it, each with the batch's end offsets, so a table holds the rows of exactly the
events before its *own* end offsets (:meth:`~exactly.lake.base.LakeTable.end_offsets`) that have
a row in it. The recount reads the topic once, up to the furthest of them, and the executors
give each event its tables with the layout's own rules (:func:`~exactly.lake.segment.rows_of`,
as the lake query shapes it, names fitted to the default ``Limits.name_bytes``), keeping an
event for a table when it is before that table's end offsets:

* an appended table (``tracks``, ``order_completed``, ``identifies`` …): per day of its rows
  (:func:`~exactly.lake.segment.day_of`: of ``timestamp``, else ``received_at``), its rows and
  distinct ids must both equal the recount's events;
* ``users`` and ``accounts`` (one row per id, merged): their rows and distinct ids must both
  equal the distinct user ids of the identifies (group ids of the groups) recounted.

Only the tables that exist are recounted: the events of a name ``Limits.tables`` held back have
no table (they are in ``tracks``), and a table created after its first events were held back
(the limit raised) shows those events as missing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import date
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.forget.readers import kept
from exactly.lake.base import LakeTable
from exactly.lake.query import lake_frame
from exactly.lake.segment import MERGED
from exactly.lake.sql import query, run
from exactly.spark.datasource import read_until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from exactly.forget.regulations import Forgotten
    from exactly.lake.warehouse import Warehouse

SHOWN = 20
Day = tuple[int, int]  # (rows, distinct messageIds)
_ROWS = pa.schema([("table", pa.string()), ("day", pa.date32()), ("id", pa.string())])


def differences(
    days: dict[date | None, tuple[Day | None, int]],
) -> dict[date | None, tuple[Day | None, int]]:
    """The days whose rows or distinct ids differ from the recount."""
    return {
        day: (lake, recount) for day, (lake, recount) in days.items() if lake != (recount, recount)
    }


@dataclass
class TableAudit:
    """One table of the segment layout against its recount. ``days``: day -> ((rows, distinct
    ids) in the table, or None, and the recount's events); ``users`` and ``accounts`` have one
    entry, None, over every day, whose recount is the distinct ids."""

    name: str
    end_offsets: dict[int, int] | None
    events: int = 0  # events recounted for it (users, accounts: distinct ids)
    days: dict[date | None, tuple[Day | None, int]] = field(default_factory=dict)

    @property
    def merged(self) -> bool:
        return self.name in MERGED

    @property
    def differences(self) -> dict[date | None, tuple[Day | None, int]]:
        return differences(self.days)


@dataclass
class LakeAudit:
    url: str
    end_offsets: dict[int, int] | None  # where the recount stopped: the table's newest batch
    events: int = 0  # records recounted
    days: dict[date | None, tuple[Day | None, int]] = field(default_factory=dict)  # lake, recount
    tables: list[TableAudit] | None = None  # the segment layout's, by name; None: no layout

    @property
    def differences(self) -> dict[date | None, tuple[Day | None, int]]:
        return differences(self.days)

    @property
    def exact(self) -> bool:
        return not self.differences and not any(t.differences for t in self.tables or ())


def audit_lake(
    spark: SparkSession,
    log_url: str,
    topic: str,
    table: LakeTable,
    warehouse: Warehouse | None = None,
    forgotten: Forgotten | None = None,
) -> LakeAudit:
    """Recount ``topic`` per day up to ``table``'s position and compare with the table; given
    the ``warehouse`` beside it (the segment layout), each of its tables too. The records of
    the ``forgotten`` people are not recounted: a Kafka topic still holds them (the embedded
    log holds stubs), and the lake holds none."""
    from pyspark.sql import functions as F

    result = LakeAudit(table.url, table.end_offsets())
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the date is the UTC day
    recount: dict[date | None, int] = {}
    if result.end_offsets:
        records = kept(read_until(spark, log_url, topic, result.end_offsets), forgotten)
        per_day = lake_frame(records).groupBy("date").agg(F.count(F.lit(1)).alias("n"))
        recount = {row["date"]: int(row["n"]) for row in per_day.collect()}
    result.events = sum(recount.values())
    landed = query(
        table, "select date, count(*) as n, count(distinct messageId) as d from events group by 1"
    )
    lake: dict[date | None, Day] = {
        row["date"]: (int(row["n"]), int(row["d"])) for row in landed.to_pylist()
    }
    for day in sorted(set(recount) | set(lake), key=_day_order):
        result.days[day] = (lake.get(day), recount.get(day, 0))
    if warehouse is not None:
        result.tables = audit_tables(spark, log_url, topic, warehouse, forgotten)
    return result


def audit_tables(
    spark: SparkSession,
    log_url: str,
    topic: str,
    warehouse: Warehouse,
    forgotten: Forgotten | None = None,
) -> list[TableAudit]:
    """Each table of the segment layout against the events before its own end offsets (module
    docstring), by name."""
    audits = {
        name: TableAudit(name, warehouse.table(name).end_offsets()) for name in warehouse.tables()
    }
    ends = {name: audit.end_offsets for name, audit in audits.items() if audit.end_offsets}
    furthest: dict[int, int] = {}
    for found in ends.values():
        for partition, offset in found.items():
            furthest[partition] = max(offset, furthest.get(partition, 0))
    recount: dict[str, dict[date | None, int]] = {}
    if furthest:
        records = kept(read_until(spark, log_url, topic, furthest), forgotten)
        recount = _recount(_table_rows(records, ends))
    for name, audit in audits.items():
        counted = recount.get(name, {})
        audit.events = sum(counted.values())
        lake = _held(warehouse.table(name), merged=audit.merged)
        for day in sorted(set(counted) | set(lake), key=_day_order):
            audit.days[day] = (lake.get(day), counted.get(day, 0))
    return list(audits.values())


def _table_rows(records: DataFrame, ends: Mapping[str, Mapping[int, int]]) -> DataFrame:
    """Per record, a row (table, day, id) for each table it has a row in and is before that
    table's end offsets (on the executors)."""
    return records.select("partition", "offset", "value").mapInArrow(
        partial(_rows_task, {name: dict(found) for name, found in ends.items()}),
        "table string, day date, id string",
    )


def _rows_task(
    ends: dict[str, dict[int, int]], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    import orjson

    from exactly.lake.segment import day_of, rows_of

    for batch in batches:
        tables: list[str] = []
        days: list[date | None] = []
        ids: list[str] = []
        columns = (batch.column(name).to_pylist() for name in ("partition", "offset", "value"))
        for partition, offset, value in zip(*columns, strict=True):
            try:
                event = orjson.loads(value) if value else None
            except orjson.JSONDecodeError:
                continue
            if not isinstance(event, dict):
                continue
            for name, key in rows_of(event):
                if name in ends and offset < ends[name].get(partition, 0):
                    tables.append(name)
                    days.append(None if name in MERGED else day_of(event))
                    ids.append(key)
        yield pa.RecordBatch.from_pydict({"table": tables, "day": days, "id": ids}, _ROWS)


def _recount(rows: DataFrame) -> dict[str, dict[date | None, int]]:
    """Per table and day the events (appended tables), per table the distinct ids (merged)."""
    from pyspark.sql import functions as F

    merged = F.col("table").isin(*MERGED)
    appended = rows.where(~merged).groupBy("table", "day").agg(F.count(F.lit(1)).alias("n"))
    keys = rows.where(merged).groupBy("table").agg(F.countDistinct("id").alias("n"))
    found: dict[str, dict[date | None, int]] = {}
    for row in [*appended.collect(), *keys.collect()]:
        found.setdefault(row["table"], {})[row.asDict().get("day")] = int(row["n"])
    return found


def _held(table: LakeTable, *, merged: bool) -> dict[date | None, Day]:
    """The table's rows and distinct ids per day of its rows (merged: over every day, None)."""
    if merged:
        text = "select null as day, count(*) as n, count(distinct id) as d from t"
    else:
        day = 'cast(coalesce("timestamp", received_at) as date)'
        text = f"select {day} as day, count(*) as n, count(distinct id) as d from t group by 1"
    found = run({"t": table}, text).to_pylist()
    return {row["day"]: (int(row["n"]), int(row["d"])) for row in found if row["n"]}


def _day_order(day: date | None) -> tuple[bool, date | None]:
    return day is None, day


def render(result: LakeAudit) -> list[str]:
    """The lake's audit for people, within 80 columns: what was compared, then up to
    :data:`SHOWN` days that differ (and, with the segment layout, tables and days)."""
    from exactly.text import wrap

    where = "nothing landed yet" if result.end_offsets is None else f"offsets {result.end_offsets}"
    differ = result.differences
    lines = [
        wrap(f"lake audit: recounted {result.events:,} events up to {where}", "  "),
        wrap(
            f"  {result.url}: {len(result.days):,} days, "
            + ("exact" if not differ else f"{len(differ):,} differ"),
            "    ",
        ),
    ]
    for day, (lake, recount) in list(differ.items())[:SHOWN]:
        held = "no rows" if lake is None else f"{lake[0]:,} rows of {lake[1]:,} messageIds"
        lines.append(f"  {day or 'no date'}: lake {held}, recount {recount:,} events")
    if len(differ) > SHOWN:
        lines.append(f"  ... and {len(differ) - SHOWN:,} more")
    if result.tables is not None:
        lines += _table_lines(result.tables)
    lines.append("lake audit: exact" if result.exact else "lake audit: DIFFERENCES FOUND")
    return lines


def _table_lines(tables: list[TableAudit]) -> list[str]:
    from exactly.text import wrap

    differ = [(t, day, found) for t in tables for day, found in t.differences.items()]
    names = {t.name for t, _, _ in differ}
    lines = [
        wrap(
            f"  segment layout: {len(tables):,} tables, each up to its own end offsets, "
            + ("exact" if not differ else f"{len(names):,} differ"),
            "    ",
        )
    ]
    for table, day, (lake, recount) in differ[:SHOWN]:
        held = "no rows" if lake is None else f"{lake[0]:,} rows of {lake[1]:,} ids"
        if table.merged:
            what = "user ids" if table.name == "users" else "group ids"
            lines.append(wrap(f"  {table.name}: lake {held}, recount {recount:,} {what}", "    "))
        else:
            lines.append(
                wrap(
                    f"  {table.name} {day or 'no date'}: lake {held}, recount {recount:,} events",
                    "    ",
                )
            )
    if len(differ) > SHOWN:
        lines.append(f"  ... and {len(differ) - SHOWN:,} more")
    return lines
