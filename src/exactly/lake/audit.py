"""The lake's part of ``exactly audit``: ``events`` recounted per day against the lake table.

The recount is a Spark batch read of the topic up to the end offsets the table committed with its
newest batch (so a lake query that keeps running shows no difference), each record given its day
as the lake query gives it (:func:`~exactly.lake.query.lake_frame`). The table's side is DuckDB
over its current version (:mod:`exactly.lake.sql`). Per day, the rows and the distinct messageIds
must both equal the recount's records: a row missing, a row twice or a row on the wrong day shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING

from exactly.lake.base import LakeTable
from exactly.lake.query import lake_frame
from exactly.lake.sql import query
from exactly.spark.datasource import read_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHOWN = 20
Day = tuple[int, int]  # (rows, distinct messageIds)


@dataclass
class LakeAudit:
    url: str
    end_offsets: dict[int, int] | None  # where the recount stopped: the table's newest batch
    events: int = 0  # records recounted
    days: dict[date | None, tuple[Day | None, int]] = field(default_factory=dict)  # lake, recount

    @property
    def differences(self) -> dict[date | None, tuple[Day | None, int]]:
        return {
            day: (lake, recount)
            for day, (lake, recount) in self.days.items()
            if lake != (recount, recount)
        }

    @property
    def exact(self) -> bool:
        return not self.differences


def audit_lake(spark: SparkSession, log_url: str, topic: str, table: LakeTable) -> LakeAudit:
    """Recount ``topic`` per day up to ``table``'s position and compare with the table."""
    from pyspark.sql import functions as F

    result = LakeAudit(table.url, table.end_offsets())
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the date is the UTC day
    recount: dict[date | None, int] = {}
    if result.end_offsets:
        records = read_until(spark, log_url, topic, result.end_offsets)
        per_day = lake_frame(records).groupBy("date").agg(F.count(F.lit(1)).alias("n"))
        recount = {row["date"]: int(row["n"]) for row in per_day.collect()}
    result.events = sum(recount.values())
    landed = query(
        table, "select date, count(*) as n, count(distinct messageId) as d from events group by 1"
    )
    lake: dict[date | None, Day] = {
        row["date"]: (int(row["n"]), int(row["d"])) for row in landed.to_pylist()
    }
    for day in sorted(set(recount) | set(lake), key=lambda d: (d is None, d)):
        result.days[day] = (lake.get(day), recount.get(day, 0))
    return result


def render(result: LakeAudit) -> list[str]:
    """The lake's audit for people, within 80 columns: what was compared, then up to
    :data:`SHOWN` days that differ."""
    from exactly.text import wrap

    where = "nothing landed yet" if result.end_offsets is None else f"offsets {result.end_offsets}"
    lines = [
        wrap(f"lake audit: recounted {result.events:,} events up to {where}", "  "),
        wrap(
            f"  {result.url}: {len(result.days):,} days, "
            + ("exact" if result.exact else f"{len(result.differences):,} differ"),
            "    ",
        ),
    ]
    for day, (lake, recount) in list(result.differences.items())[:SHOWN]:
        held = "no rows" if lake is None else f"{lake[0]:,} rows of {lake[1]:,} messageIds"
        lines.append(f"  {day or 'no date'}: lake {held}, recount {recount:,} events")
    if len(result.differences) > SHOWN:
        lines.append(f"  ... and {len(result.differences) - SHOWN:,} more")
    lines.append("lake audit: exact" if result.exact else "lake audit: DIFFERENCES FOUND")
    return lines
