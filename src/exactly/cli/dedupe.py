"""``exactly dedupe``: raw -> events, each messageId once per window, exactly once (Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import with_flags
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp
from exactly.stages import DEDUPE

STORE_HELP = (
    "Where seen messageIds are kept, as a URL: rocksdb (local disk under the data dir) or "
    "rocksdb://DIR; redis://HOST:PORT,HOST:PORT/DB?namespace=NS&buckets=N&slot=3h"
    "&previous=HOST:PORT,...&cutover=TIME (Redis servers, sharded; a password as "
    "redis://:PASSWORD@HOST... is never shown); spark-state (Spark's "
    "dropDuplicatesWithinWatermark) [dedupe.store; default rocksdb]."
)


def dedupe(
    ctx: typer.Context,
    master: Master = None,
    store: Annotated[str | None, typer.Option(help=STORE_HELP, show_default=False)] = None,
    window: Annotated[
        str | None,
        typer.Option(
            help="How long a messageId is remembered (24h, 7d, 90m ...): rocksdb ages out ids "
            "older than this, redis expires them, spark-state uses it as the watermark delay "
            "[dedupe.window; default 24h].",
            show_default=False,
        ),
    ] = None,
    max_keys: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="rocksdb: messageIds kept per partition at most; the oldest age out first "
            "[dedupe.max_keys].",
        ),
    ] = None,
    max_bytes: Annotated[
        str | None,
        typer.Option(
            help="rocksdb: about this much disk per partition at most (512MB, 2GiB ...) "
            "[dedupe.max_bytes].",
        ),
    ] = None,
    min_window: Annotated[
        str | None,
        typer.Option(
            help="Warn when the size bounds shrink the window below this "
            "[dedupe.min_window; default 24h].",
            show_default=False,
        ),
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(
            help="What makes a duplicate: the same messageId from the same source (source, so "
            "no write key can suppress another source's events) or from any source "
            "(workspace). A store keeps the scope it was built with "
            "[dedupe.scope; default source].",
            show_default=False,
        ),
    ] = None,
    source: Annotated[str, typer.Option(help="Topic to read.")] = "raw",
    output: Annotated[
        str, typer.Option(help="Topic to write (created like the source if missing).")
    ] = "events",
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: DATA_DIR/checkpoints/dedupe-*)."),
    ] = None,
    until_caught_up: UntilCaughtUp = False,
    max_records_per_trigger: MaxRecordsPerTrigger = DEDUPE.max_records_per_trigger,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Copy SOURCE to OUTPUT keeping the first record of each messageId within the window.

    With --scope source (the default) a messageId counts once per sourceId, with workspace once
    in all. Every option but the topics and the checkpoint also comes from [dedupe] in the config
    file or EXACTLY_DEDUPE__<NAME> (EXACTLY_DEDUPE__STORE=redis://...).

    Partition p of SOURCE goes to partition p of OUTPUT, values untouched, each record with its
    source offset in header exactly.source.offset. Records without a messageId go to
    SOURCE.rejected with the reason. Killed at any point, it resumes without losing or
    repeating a record. Progress and the window per partition: `exactly status`.
    """
    from exactly.dedupe.driver import say_line
    from exactly.events.ids import check_scope
    from exactly.spark.session import build_session
    from exactly.units import parse_duration, parse_size

    # named after the flag, before the settings check them (which would name the setting)
    for flag, duration in (("--window", window), ("--min-window", min_window)):
        if duration is not None:
            parse_duration(duration, flag)
    if max_bytes is not None:
        parse_size(max_bytes, "--max-bytes")
    if scope is not None:
        check_scope(scope)
    flags = {
        "dedupe.store": store,
        "dedupe.window": window,
        "dedupe.max_keys": max_keys,
        "dedupe.max_bytes": max_bytes,
        "dedupe.min_window": min_window,
        "dedupe.scope": scope,
    }
    settings = with_flags(ctx, flags, master=master).settings
    plan = DEDUPE.plan(
        settings,
        source=source,
        output=output,
        checkpoint=checkpoint,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
    )

    def report(batch: int, records: int) -> None:
        if records:
            say_line(f"batch {batch}: {records} records")

    with DEDUPE.open(plan, say_line) as target:
        spark = build_session(settings, app_name=f"exactly-dedupe-{source}")
        summary = DEDUPE.drive(spark, plan, target, say=say_line, on_batch=report)
        spark.stop()
    done = "caught up" if until_caught_up else "stopped"
    print(f"{done}: {summary.records:,} records read in {summary.batches:,} micro-batches")
    from exactly.dedupe.status import render

    print(render(summary.status, settings.data_dir))
