"""``exactly stats``: the event counts by time bucket, source, type and event, from SQL."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from exactly.aggregate.base import AggregateDB, Row, quote
from exactly.aggregate.spec import EVENT_COUNTS
from exactly.errors import ConfigError

BUCKETS = ("minute", "hour", "day")


@dataclass(frozen=True)
class StatsQuery:
    source: str | None = None
    event: str | None = None
    since: str | None = None  # 'YYYY-MM-DD HH:MM:SS', UTC
    by: str = "hour"
    limit: int = 50


def parse_since(text: str, now: datetime | None = None) -> str:
    """A duration back from now (``24h``, ``7d``) or a UTC time (``2024-05-01T10:00``)."""
    from exactly.units import parse_duration

    now = now or datetime.now(UTC)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = now - timedelta(milliseconds=parse_duration(text, "--since"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def event_counts(db: AggregateDB, query: StatsQuery) -> list[Row]:
    """(bucket, source, type, event, count, revenue), the newest ``limit`` rows, oldest first."""
    if query.by not in BUCKETS:
        raise ConfigError(f"--by {query.by!r}: use minute, hour or day")
    if EVENT_COUNTS.name not in db.tables():
        return []
    bucket = db.time_bucket(quote("minute"), query.by)
    where, args = [], []
    for column, value in (("source", query.source), ("event", query.event)):
        if value is not None:
            where.append(f"{quote(column)} = ?")
            args.append(value)
    if query.since is not None:
        where.append(f"{quote('minute')} >= ?")
        args.append(query.since)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = db.query(
        f"SELECT {bucket} AS bucket, source, type, event, SUM({quote('count')}), SUM(revenue) "
        f"FROM {EVENT_COUNTS.name} {clause} GROUP BY 1, 2, 3, 4 "
        f"ORDER BY 1 DESC, 2, 3, 4 LIMIT {int(query.limit)}",
        args,
    )
    return list(reversed(rows))


def total_events(db: AggregateDB) -> int:
    """Every event counted in ``event_counts`` so far (0 before the table exists)."""
    if EVENT_COUNTS.name not in db.tables():
        return 0
    rows = db.query(f"SELECT COALESCE(SUM({quote('count')}), 0) FROM {EVENT_COUNTS.name}", [])
    return int(rows[0][0]) if rows else 0
