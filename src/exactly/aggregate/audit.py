"""``exactly audit``: recount every table from ``events`` with a batch read, compare with SQL.

The recount reads the topic up to the end offsets of the last batch the database counted (its
newest marker), so a job that keeps running does not show up as a difference. Counts and integer
sums must be equal; decimal sums too on PostgreSQL (NUMERIC), and within 1e-12 of their size on
SQLite (REAL, see ``sqlite.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

from exactly.aggregate.base import AggregateDB, Row, normalise_row
from exactly.aggregate.frame import aggregate, events_frame
from exactly.aggregate.spec import EVENT_COUNTS, TableSpec
from exactly.spark.datasource import read_until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SHOWN = 20
TOLERANCE = Decimal("1e-12")  # relative, for SQLite's REAL sums


@dataclass(frozen=True)
class Difference:
    table: str
    key: Row
    counted: Row | None  # the database's measures, None when the row is missing
    recounted: Row | None  # the recount's, None when the database has a row too many


@dataclass
class AuditResult:
    end_offsets: dict[int, int] | None
    events: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    differences: list[Difference] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.differences


def same(spec: TableSpec, counted: Row, recounted: Row, exact_decimals: bool) -> bool:
    for measure, a, b in zip(spec.measures, counted, recounted, strict=True):
        if measure.kind == "decimal" and not exact_decimals:
            truth = Decimal(b)
            allowed = TOLERANCE * max(abs(truth), Decimal(1)) + Decimal("0.000001")
            if abs(Decimal(a) - truth) > allowed:
                return False
        elif a != b:
            return False
    return True


def compare(
    spec: TableSpec, counted: Sequence[Row], recounted: Sequence[Row], exact_decimals: bool
) -> list[Difference]:
    """Rows that differ between the database and the recount, by key."""
    width = len(spec.keys)
    mine = {row[:width]: row[width:] for row in counted}
    truth = {row[:width]: row[width:] for row in recounted}
    out = []
    for key in sorted(set(mine) | set(truth)):
        a, b = mine.get(key), truth.get(key)
        if a is None or b is None or not same(spec, a, b, exact_decimals):
            out.append(Difference(spec.name, key, a, b))
    return out


def run_audit(
    spark: SparkSession, log_url: str, topic: str, db: AggregateDB, specs: Sequence[TableSpec]
) -> AuditResult:
    """Recount ``specs`` from ``topic`` up to the database's position and compare."""
    owners = db.tables()
    checkpoint = owners.get(EVENT_COUNTS.name, ("", None))[1]
    marker = db.latest_marker(checkpoint, topic) if checkpoint else None
    result = AuditResult(None if marker is None else marker.end_offsets)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    recounts: dict[str, list[Row]] = {spec.name: [] for spec in specs}
    if result.end_offsets:
        records = read_until(spark, log_url, topic, result.end_offsets)
        frame = events_frame(records, specs).persist()
        try:
            for spec in specs:
                recounts[spec.name] = [
                    normalise_row(spec, tuple(row)) for row in aggregate(frame, spec).collect()
                ]
        finally:
            frame.unpersist()
    exact_decimals = db.decimal_type != "REAL"
    for spec in specs:
        counted = db.table_rows(spec) if spec.name in owners else []
        result.rows[spec.name] = len(counted)
        result.differences += compare(spec, counted, recounts[spec.name], exact_decimals)
        if spec.name == EVENT_COUNTS.name:
            result.events = sum(int(row[len(spec.keys)]) for row in recounts[spec.name])
    return result


def render(result: AuditResult, specs: Sequence[TableSpec]) -> list[str]:
    """The audit for people, within 80 columns: what was compared, then up to :data:`SHOWN`
    differing rows."""
    from exactly.text import wrap

    where = "nothing counted yet" if result.end_offsets is None else f"offsets {result.end_offsets}"
    lines = [wrap(f"audit: recounted {result.events:,} events from the topic up to {where}", "  ")]
    by_name = {spec.name: spec for spec in specs}
    for name, rows in result.rows.items():
        wrong = sum(1 for d in result.differences if d.table == name)
        lines.append(f"  {name}: {rows:,} rows, {'exact' if not wrong else f'{wrong:,} differ'}")
    for difference in result.differences[:SHOWN]:
        spec = by_name[difference.table]
        key = ", ".join(f"{k.name}={v!r}" for k, v in zip(spec.keys, difference.key, strict=True))
        lines.append(
            wrap(
                f"  {difference.table} ({key}): database {_measures(spec, difference.counted)}, "
                f"recount {_measures(spec, difference.recounted)}",
                "    ",
            )
        )
    if len(result.differences) > SHOWN:
        lines.append(f"  ... and {len(result.differences) - SHOWN:,} more")
    lines.append("audit: exact" if result.exact else "audit: DIFFERENCES FOUND")
    return lines


def _measures(spec: TableSpec, values: Row | None) -> str:
    if values is None:
        return "no row"
    return " ".join(f"{m.name}={v}" for m, v in zip(spec.measures, values, strict=True))
