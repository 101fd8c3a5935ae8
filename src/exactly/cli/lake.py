"""``exactly lake``: the events into a lake table exactly once, and the table's upkeep."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from exactly.cli.context import with_flags
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp
from exactly.cli.output import fit, message, place
from exactly.stages import LAKE

TABLE = typer.Option(
    "--table",
    help="Lake table URL: delta://PATH, iceberg://DIR, postgresql://USER@HOST/DB?table=events "
    "(default: [lake] url, else delta://DATA_DIR/lake/events).",
    envvar="EXACTLY_LAKE__URL",
)

app = typer.Typer(
    help="Append every event of TOPIC to the lake table, each exactly once; maintain the table.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def lake(
    ctx: typer.Context,
    master: Master = None,
    table: Annotated[str | None, TABLE] = None,
    topic: Annotated[str, typer.Option(help="The deduplicated topic to land.")] = "events",
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: DATA_DIR/checkpoints/lake-TOPIC)."),
    ] = None,
    until_caught_up: UntilCaughtUp = False,
    max_records_per_trigger: MaxRecordsPerTrigger = LAKE.max_records_per_trigger,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Append every event of TOPIC to the lake table, exactly once however often it is killed.

    Each micro-batch commits with its (query id, batch id) marker in one table transaction
    (Delta's txn action, an Iceberg snapshot property, a PostgreSQL marker row), so a replayed
    batch commits nothing. Columns: the event's fields, its times in UTC, properties, traits and
    context as JSON text, its UTC date, and the promoted [lake] columns.
    """
    if ctx.invoked_subcommand is not None:
        return
    from exactly.lake.query import say_line
    from exactly.spark.session import build_session

    settings = with_flags(ctx, {"lake.url": table}, master=master).settings
    plan = LAKE.plan(
        settings,
        topic=topic,
        checkpoint=checkpoint,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
    )

    def report(batch: int, events: int, appended: bool) -> None:
        if events or not appended:
            how = "appended" if appended else "already in the table (replay), skipped"
            say_line(f"batch {batch}: {events:,} events {how}")

    with LAKE.open(plan, say_line) as opened:
        spark = build_session(settings, app_name=f"exactly-lake-{topic}")
        progress = LAKE.drive(spark, plan, opened, say=say_line, on_batch=report)
        spark.stop()
    done = "caught up" if until_caught_up else "stopped"
    print(
        f"{done}: {progress.events:,} events appended in {len(progress.batches):,} micro-batches"
        + (f", {progress.replays:,} replayed batch skipped" if progress.replays else "")
    )


@app.command()
def optimize(ctx: typer.Context, table: Annotated[str | None, TABLE] = None) -> None:
    """Compact the table's small files; what a query returns does not change."""
    from exactly.lake import open_table

    settings = with_flags(ctx, {"lake.url": table}).settings
    with open_table(settings.lake_url) as opened:
        done = opened.optimize()
    where = place(opened.url, settings.data_dir)
    print(message(f"{where}: {done.files_removed:,} files compacted into {done.files_added:,}"))


@app.command()
def vacuum(
    ctx: typer.Context,
    table: Annotated[str | None, TABLE] = None,
    older_than: Annotated[
        str | None,
        typer.Option(help="Only files older than this (default: [lake] vacuum_age, 1h)."),
    ] = None,
    expire: Annotated[
        bool,
        typer.Option(
            "--expire/--no-expire",
            help="Also forget versions older than [lake] retention (default 7d).",
        ),
    ] = True,
) -> None:
    """Remove the files of batches killed before their commit (in no version of the table),
    and versions older than the retention."""
    from exactly.lake import open_table
    from exactly.units import parse_duration

    settings = with_flags(ctx, {"lake.url": table, "lake.vacuum_age": older_than}).settings
    age = timedelta(milliseconds=parse_duration(settings.lake.vacuum_age, "--older-than"))
    retention = timedelta(milliseconds=parse_duration(settings.lake.retention, "retention"))
    with open_table(settings.lake_url) as opened:
        expired = opened.expire(retention) if expire else 0
        removed = opened.vacuum(age)
    for path in removed:
        print(fit("removed", str(path)))
    print(
        message(
            f"{place(opened.url, settings.data_dir)}: {len(removed):,} uncommitted files removed"
            + (f", {expired:,} expired versions or files" if expire else "")
        )
    )


@app.command()
def sql(
    ctx: typer.Context,
    query: Annotated[
        str,
        typer.Argument(
            help='The SQL; the table is called events, and with [lake] layout = "segment" '
            "each of Segment's tables (tracks, order_completed, users ...) by its name."
        ),
    ],
    table: Annotated[str | None, TABLE] = None,
    output: Annotated[
        str, typer.Option("--format", help="table (at most --max-rows rows), csv or json.")
    ] = "table",
    max_rows: Annotated[int, typer.Option(help="Rows a table shows.")] = 100,
) -> None:
    """Run QUERY with DuckDB over the table's current version, called events in it.

    With [lake] layout = "segment", Segment's tables beside it are read by their names: those
    the query names are registered (SHOW TABLES lists only those).

    For example: exactly lake sql "select event, count(*) from events group by 1 order by 2 desc"
    or exactly lake sql "select sum(revenue) from order_completed"
    """
    from exactly.errors import ConfigError
    from exactly.lake import open_table
    from exactly.lake.sql import query as run_query

    if output not in ("table", "csv", "json"):
        raise ConfigError(f"--format {output!r}: use table, csv or json")
    settings = with_flags(ctx, {"lake.url": table}).settings
    with open_table(settings.lake_url) as opened:
        rows = run_query(opened, query, siblings=settings.lake.layout == "segment")
    show_rows(rows, output, max_rows)


def show_rows(rows: Any, output: str, max_rows: int) -> None:
    """Arrow ``rows`` on stdout: CSV, JSON lines, or text within 80 columns (a table when its
    columns fit, else each row as ``column  value`` lines)."""
    import sys

    if output == "csv":
        import pyarrow.csv as csv  # type: ignore[import-untyped]

        csv.write_csv(rows, sys.stdout.buffer)
        return
    if output == "json":
        for row in rows.to_pylist():
            print(json.dumps(row, default=_text, ensure_ascii=False))
        return
    from exactly.cli.output import WIDTH, console, count
    from exactly.cli.output import table as new_table

    names = rows.column_names
    cells = [
        ["-" if v is None else _text(v) for v in row.values()]
        for row in rows.slice(0, max_rows).to_pylist()
    ]
    widths = [max([len(name)] + [len(row[i]) for row in cells]) for i, name in enumerate(names)]
    out = console()
    if sum(widths) + 2 * len(widths) <= WIDTH:
        shown = new_table(*names)
        for row in cells:
            shown.add_row(*row)
        out.print(shown)
    else:  # too wide for a table: one block per row
        import textwrap

        label = min(max(len(name) for name in names), 24)
        room = WIDTH - label - 2
        for number, row in enumerate(cells, 1):
            print(f"-- row {number}")
            for name, value in zip(names, row, strict=True):
                head = name.ljust(label) if len(name) <= label else f"{name}\n{' ' * label}"
                lines = textwrap.wrap(value, room, break_on_hyphens=False) or [""]
                print(f"{head}  " + f"\n{' ' * (label + 2)}".join(lines))
    if rows.num_rows > max_rows:
        print(f"{count(rows.num_rows - max_rows)} more rows: add a LIMIT, or --format csv")
    print(f"({count(rows.num_rows)} rows)")


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.10g}"
    if hasattr(value, "isoformat"):
        return str(value.isoformat()).replace("+00:00", "Z")
    return str(value)
