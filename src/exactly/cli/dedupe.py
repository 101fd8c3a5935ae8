"""``exactly dedupe``: raw -> events, each messageId once per window, exactly once (Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.cli.options import MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp

STORE_HELP = (
    "Where seen messageIds are kept: rocksdb (local disk, the default), redis (shared Redis "
    "servers, --redis) or spark-state (Spark's dropDuplicatesWithinWatermark)."
)


def dedupe(
    ctx: typer.Context,
    store: Annotated[str, typer.Option(help=STORE_HELP, envvar="EXACTLY_DEDUPE__STORE")] = (
        "rocksdb"
    ),
    window: Annotated[
        str,
        typer.Option(
            help="How long a messageId is remembered (24h, 7d, 90m ...): rocksdb ages out ids "
            "older than this, spark-state uses it as the watermark delay.",
            envvar="EXACTLY_DEDUPE__WINDOW",
        ),
    ] = "24h",
    max_keys: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="rocksdb: messageIds kept per partition at most; the oldest age out first.",
            envvar="EXACTLY_DEDUPE__MAX_KEYS",
        ),
    ] = None,
    max_bytes: Annotated[
        str | None,
        typer.Option(
            help="rocksdb: about this much disk per partition at most (512MB, 2GiB ...).",
            envvar="EXACTLY_DEDUPE__MAX_BYTES",
        ),
    ] = None,
    min_window: Annotated[
        str,
        typer.Option(
            help="Warn when the size bounds shrink the window below this.",
            envvar="EXACTLY_DEDUPE__MIN_WINDOW",
        ),
    ] = "24h",
    redis: Annotated[
        list[str] | None,
        typer.Option(
            help="redis: a server URL (redis://HOST:PORT/DB); repeat it or separate by commas "
            "to shard over several.",
            envvar="EXACTLY_DEDUPE__REDIS",
        ),
    ] = None,
    redis_previous: Annotated[
        list[str] | None,
        typer.Option(
            help="redis, resharding: the servers before --redis-cutover; ids received before "
            "it are looked up there. Drop it once the cutover is a window old.",
            envvar="EXACTLY_DEDUPE__REDIS_PREVIOUS",
        ),
    ] = None,
    redis_cutover: Annotated[
        str | None,
        typer.Option(
            help="redis, resharding: when --redis takes over (ISO time such as "
            "2026-11-22T10:00Z, or ms), by the receive time of records.",
            envvar="EXACTLY_DEDUPE__REDIS_CUTOVER",
        ),
    ] = None,
    redis_buckets: Annotated[
        int,
        typer.Option(
            min=1,
            help="redis: hashes per partition and slot; aim at ids per slot and partition / "
            "300. Changing it, like the servers, needs --redis-previous and a cutover.",
            envvar="EXACTLY_DEDUPE__REDIS_BUCKETS",
        ),
    ] = 1024,
    redis_slot: Annotated[
        str,
        typer.Option(
            help="redis: ids are grouped by receive time in slots this long; a lookup reads "
            "window / slot + 2 slots, and memory holds window + 2 slots of ids.",
            envvar="EXACTLY_DEDUPE__REDIS_SLOT",
        ),
    ] = "3h",
    redis_previous_buckets: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="redis, resharding: --redis-buckets before the cutover (default: the same).",
            envvar="EXACTLY_DEDUPE__REDIS_PREVIOUS_BUCKETS",
        ),
    ] = None,
    redis_previous_slot: Annotated[
        str | None,
        typer.Option(
            help="redis, resharding: --redis-slot before the cutover (default: the same).",
            envvar="EXACTLY_DEDUPE__REDIS_PREVIOUS_SLOT",
        ),
    ] = None,
    scope: Annotated[
        str | None,
        typer.Option(
            help="What makes a duplicate: the same messageId from the same source (source, so "
            "no write key can suppress another source's events) or from any source "
            "(workspace). Default: [dedupe] scope in the config, else source. A store keeps "
            "the scope it was built with.",
            envvar="EXACTLY_DEDUPE__SCOPE",
            show_default=False,
        ),
    ] = None,
    redis_namespace: Annotated[
        str | None,
        typer.Option(
            help="redis: key prefix (default exactly:dedupe:SOURCE).",
            envvar="EXACTLY_DEDUPE__REDIS_NAMESPACE",
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
    max_records_per_trigger: MaxRecordsPerTrigger = None,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Copy SOURCE to OUTPUT keeping the first record of each messageId within the window.

    With --scope source (the default) a messageId counts once per sourceId, with workspace once
    in all.

    Partition p of SOURCE goes to partition p of OUTPUT, values untouched, each record with its
    source offset in header exactly.source.offset. Records without a messageId go to
    SOURCE.rejected with the reason. Killed at any point, it resumes without losing or
    repeating a record. Progress and the window per partition: `exactly status`.
    """
    from exactly.dedupe.driver import drive
    from exactly.dedupe.job import DedupePlan, default_checkpoint
    from exactly.dedupe.redis.sharding import sharding_from
    from exactly.dedupe.window import Bounds
    from exactly.units import parse_duration, parse_size

    settings = context(ctx).settings
    sharding = None
    if store == "redis":
        sharding = sharding_from(
            redis,
            buckets=redis_buckets,
            slot=redis_slot,
            previous=redis_previous,
            previous_buckets=redis_previous_buckets,
            previous_slot=redis_previous_slot,
            cutover=redis_cutover,
        )
    bounds = Bounds(
        max_keys=max_keys,
        max_bytes=None if max_bytes is None else parse_size(max_bytes, "--max-bytes"),
        window=parse_duration(window, "--window"),
    )
    plan = DedupePlan(
        log_url=settings.log_url,
        store=store,
        data_dir=settings.data_dir,
        checkpoint=(
            checkpoint or default_checkpoint(settings.data_dir, store, source, output)
        ).resolve(),
        source=source,
        output=output,
        bounds=bounds,
        min_window=parse_duration(min_window, "--min-window"),
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        max_record_bytes=settings.log.max_record_bytes,
        redis=sharding,
        redis_namespace=redis_namespace,
        scope=scope or settings.dedupe.scope,
    )
    summary = drive(settings, plan)
    done = "caught up" if until_caught_up else "stopped"
    print(f"{done}: {summary.records} records read in {summary.batches} micro-batches")
    from exactly.dedupe.status import render

    print(render(summary.status))
