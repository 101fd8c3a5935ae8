"""``exactly aggregate``, ``stats`` and ``audit``: events counted into SQL exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Column

from exactly.cli.context import stop_if_never_ran, with_flags
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp
from exactly.stages import AGGREGATE
from exactly.urls import embedded_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.config import Settings
    from exactly.lake.audit import LakeAudit

DB = typer.Option(
    "--db",
    help="Aggregate database: sqlite:///FILE or postgresql://USER@HOST/DB "
    "(default: sqlite DATA_DIR/aggregates.db).",
    envvar="EXACTLY_AGGREGATE__URL",
)
TOPIC = typer.Option(help="The deduplicated topic to count.")


def aggregate(
    ctx: typer.Context,
    master: Master = None,
    db: Annotated[str | None, DB] = None,
    topic: Annotated[str, TOPIC] = "events",
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: DATA_DIR/checkpoints/aggregate-TOPIC)."),
    ] = None,
    until_caught_up: UntilCaughtUp = False,
    max_records_per_trigger: MaxRecordsPerTrigger = AGGREGATE.max_records_per_trigger,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Count TOPIC into SQL tables, each event exactly once however often the job is killed.

    Built in: event_counts(source, type, event, minute, count, revenue); more tables come from
    [[aggregate.tables]] in the config. Each micro-batch's upserts commit with its batch marker
    in one transaction, so a replayed batch changes nothing.
    """
    from exactly.aggregate.job import say
    from exactly.spark.session import build_session

    settings = with_flags(ctx, {"aggregate.url": db}, master=master).settings
    plan = AGGREGATE.plan(
        settings,
        topic=topic,
        checkpoint=checkpoint,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
    )

    def report(batch: int, events: int, counted: bool) -> None:
        if events or not counted:
            how = "counted" if counted else "already counted (replay), skipped"
            say(f"batch {batch}: {events:,} events {how}")

    with AGGREGATE.open(plan, say) as database:
        spark = build_session(settings, app_name=f"exactly-aggregate-{topic}")
        progress = AGGREGATE.drive(spark, plan, database, say=say, on_batch=report)
        spark.stop()
    done = "caught up" if until_caught_up else "stopped"
    print(
        f"{done}: {progress.events:,} events counted in {len(progress.batches):,} micro-batches"
        + (f", {progress.replays:,} replayed batch skipped" if progress.replays else "")
    )


def stats(
    ctx: typer.Context,
    db: Annotated[str | None, DB] = None,
    source: Annotated[str | None, typer.Option(help="Only this source.")] = None,
    event: Annotated[str | None, typer.Option(help="Only this event name.")] = None,
    since: Annotated[
        str | None,
        typer.Option(help="From this UTC time (2024-05-01T10:00) or this long ago (24h)."),
    ] = None,
    by: Annotated[str, typer.Option(help="Time bucket: minute, hour or day.")] = "hour",
    limit: Annotated[int, typer.Option(min=1, help="Show the newest N rows.")] = 50,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object per row (source, type, event, time, count, revenue), "
            "one per line, instead of a table.",
        ),
    ] = False,
) -> None:
    """Print the event counts and revenue by time bucket, source, type and event."""
    from exactly.aggregate import open_db
    from exactly.aggregate.stats import StatsQuery, event_counts, parse_since

    settings = with_flags(ctx, {"aggregate.url": db}).settings
    query = StatsQuery(source, event, None if since is None else parse_since(since), by, limit)
    url = settings.aggregate_url
    stop_if_never_ran(settings, (embedded_path(url), "exactly aggregate"))
    with open_db(url, retry_seconds=10) as database:
        rows = event_counts(database, query)
    if as_json:
        for line in counts_as_json(rows):
            print(line)
        return
    print_counts(rows, by, limit=limit)


def counts_as_json(rows: list[tuple[Any, ...]]) -> list[str]:
    """One JSON object per row; the time as the table shows it (UTC), revenue as a number."""
    return [
        json.dumps(
            {
                "source": source,
                "type": kind,
                "event": event,
                "time": str(bucket),
                "count": int(count),
                "revenue": float(revenue),
            }
        )
        for bucket, source, kind, event, count, revenue in rows
    ]


def print_counts(
    rows: list[tuple[Any, ...]], by: str, console: Console | None = None, limit: int | None = None
) -> None:
    """The counts as a table within 80 columns, the time to its bucket, and a total row: the
    total of the rows shown, which a line says are only the newest ``limit`` when they are."""
    from exactly.cli.output import console as narrow
    from exactly.cli.output import count, table

    shown = narrow() if console is None else console
    if not rows:
        shown.print("no events counted yet")
        return
    total = count(sum(int(row[4]) for row in rows))
    earned = f"{sum(float(row[5]) for row in rows):,.2f}"
    found = table(
        Column(by, footer="total", no_wrap=True),
        "source",
        "type",
        "event",
        Column("count", footer=total, justify="right", no_wrap=True),
        Column("revenue", footer=earned, justify="right", no_wrap=True),
        show_footer=True,
    )
    for bucket, source, kind, event, number, revenue in rows:
        found.add_row(
            bucket_text(bucket, by),
            source,
            kind,
            event,
            count(int(number)),
            f"{float(revenue):,.2f}",
        )
    shown.print(found)
    if limit is not None and len(rows) >= limit:
        shown.print(f"(the newest {limit:,} rows; --limit N for more)")


def bucket_text(bucket: Any, by: str) -> str:
    """A time bucket as short as it is precise: ``2024-05-01 10:00`` for an hour or a minute,
    ``2024-05-01`` for a day (the seconds are always 00)."""
    text = str(bucket)
    return text[:10] if by == "day" else text[:16]


def audit(
    ctx: typer.Context,
    db: Annotated[str | None, DB] = None,
    topic: Annotated[str, TOPIC] = "events",
) -> None:
    """Recount every table from TOPIC (a batch Spark read) and compare with the database;
    with a lake table ([lake] url, or the default one once it exists), recount it per day too,
    and with [lake] layout = "segment" each of Segment's tables up to its own end offsets.

    Exits 1 and prints the differing rows when any differ. Each recount stops where the
    database's counting (the lake's landing) stopped, so it can run beside the pipeline.
    """
    from exactly.aggregate import open_db
    from exactly.aggregate.audit import render, run_audit
    from exactly.aggregate.driver import configured_tables
    from exactly.aggregate.frame import check
    from exactly.spark.session import build_session

    settings = with_flags(ctx, {"aggregate.url": db}).settings
    url = settings.aggregate_url
    stop_if_never_ran(
        settings,
        (embedded_path(settings.log_url), "exactly collect"),
        (embedded_path(url), "exactly aggregate"),
    )
    lake = settings.has_lake
    with open_db(url, retry_seconds=10) as database:
        spark = build_session(settings, app_name="exactly-audit")
        specs = check(spark, configured_tables(settings))
        result = run_audit(spark, settings.log_url, topic, database, specs)
        landed = _audit_lake(spark, settings, topic) if lake else None
        spark.stop()
    for line in render(result, specs):
        print(line)
    if landed is not None:
        from exactly.lake.audit import render as render_lake

        for line in render_lake(landed):
            print(line)
    if not result.exact or (landed is not None and not landed.exact):
        raise typer.Exit(1)


def _audit_lake(spark: SparkSession, settings: Settings, topic: str) -> LakeAudit:
    from exactly.forget.readers import Following
    from exactly.forget.regulations import load_key
    from exactly.lake.audit import audit_lake
    from exactly.lake.warehouse import Warehouse

    following = Following(settings.log_url, load_key(settings.data_dir))
    try:
        forgotten = following.forgotten()  # the people the lake holds none of
    finally:
        following.close()
    with Warehouse.open(settings.lake_url) as warehouse:
        segment = warehouse if settings.lake.layout == "segment" else None
        return audit_lake(spark, settings.log_url, topic, warehouse.events, segment, forgotten)
