"""``exactly route``: the events of ``events`` into the JobDB, one job per matching destination."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import with_flags
from exactly.cli.deliver import JOBDB
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp
from exactly.stages import ROUTE


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
    max_records_per_trigger: MaxRecordsPerTrigger = ROUTE.max_records_per_trigger,
    trigger_seconds: TriggerSeconds = 1.0,
) -> None:
    """Make one delivery job per (event of TOPIC, matching [[destinations]]) in the JobDB.

    Each micro-batch's jobs commit with its batch marker in one JobDB transaction, so a replayed
    batch adds nothing; `exactly deliver` sends them. No HTTP request is made here.
    """
    from exactly.delivery.route import say_line
    from exactly.spark.session import build_session

    settings = with_flags(ctx, {"delivery.jobdb": jobdb}, master=master).settings
    plan = ROUTE.plan(
        settings,
        topic=topic,
        checkpoint=checkpoint,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
    )

    def report(batch: int, events: int, jobs: int, added: bool) -> None:
        if events or not added:
            how = "added" if added else "already added (replay), skipped"
            say_line(f"batch {batch}: {jobs:,} jobs for {events:,} events {how}")

    with ROUTE.open(plan, say_line) as database:
        spark = build_session(settings, app_name=f"exactly-route-{topic}")
        progress = ROUTE.drive(spark, plan, database, say=say_line, on_batch=report)
        spark.stop()
    done = "caught up" if until_caught_up else "stopped"
    print(
        f"{done}: {progress.jobs:,} jobs for {progress.events:,} events in "
        f"{len(progress.batches):,} micro-batches"
        + (f", {progress.replays:,} replayed batch skipped" if progress.replays else "")
    )
