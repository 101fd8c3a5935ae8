"""``exactly route``: the events of ``events`` into the JobDB, one job per matching destination."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import with_master
from exactly.cli.deliver import JOBDB
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp


def route(
    ctx: typer.Context,
    master: Master = None,
    jobdb: Annotated[str | None, JOBDB] = None,
    topic: Annotated[str, typer.Option(help="The deduplicated topic to route.")] = "events",
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: DATA_DIR/checkpoints/route-TOPIC)."),
    ] = None,
    until_caught_up: UntilCaughtUp = False,
    max_records_per_trigger: MaxRecordsPerTrigger = 50_000,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Make one delivery job per (event of TOPIC, matching [[destinations]]) in the JobDB.

    Each micro-batch's jobs commit with its batch marker in one JobDB transaction, so a replayed
    batch adds nothing; `exactly deliver` sends them. No HTTP request is made here.
    """
    from exactly.cli.deliver import opened_jobdb
    from exactly.delivery.route import RoutePlan, default_checkpoint, drive, say_line
    from exactly.errors import ConfigError
    from exactly.spark.session import build_session

    settings = with_master(ctx, master).settings
    if not settings.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to route to")
    plan = RoutePlan(
        log_url=settings.log_url,
        checkpoint=(checkpoint or default_checkpoint(settings.data_dir, topic)).resolve(),
        destinations=settings.destinations,
        topic=topic,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        jobdb_patience=settings.delivery.jobdb_patience,
    )

    def report(batch: int, events: int, jobs: int, added: bool) -> None:
        if events or not added:
            how = "added" if added else "already added (replay), skipped"
            say_line(f"batch {batch}: {jobs:,} jobs for {events:,} events {how}")

    options = settings.delivery
    with opened_jobdb(
        jobdb or settings.jobdb_url,
        dataset_rows=options.dataset_rows,
        dataset_minutes=options.dataset_minutes,
    ) as database:
        spark = build_session(settings, app_name=f"exactly-route-{topic}")
        progress = drive(spark, plan, database, on_batch=report)
        spark.stop()
    done = "caught up" if until_caught_up else "stopped"
    print(
        f"{done}: {progress.jobs:,} jobs for {progress.events:,} events in "
        f"{len(progress.batches):,} micro-batches"
        + (f", {progress.replays:,} replayed batch skipped" if progress.replays else "")
    )
