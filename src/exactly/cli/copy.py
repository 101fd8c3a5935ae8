"""``exactly copy``: copy a topic into another, exactly once, as a Spark streaming query."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from exactly.cli.context import with_master
from exactly.cli.options import Master, MaxRecordsPerTrigger, TriggerSeconds, UntilCaughtUp
from exactly.cli.output import fit, place


def copy(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="Topic to read.")],
    destination: Annotated[
        str, typer.Argument(help="Topic to write (created like SOURCE if missing).")
    ],
    until_caught_up: UntilCaughtUp = False,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Checkpoint directory (default: DATA_DIR/checkpoints/copy-SRC-DST-*)."),
    ] = None,
    starting_offsets: Annotated[
        str,
        typer.Option(help='earliest, latest or JSON {"0": 10}; only for a new checkpoint.'),
    ] = "earliest",
    max_records_per_trigger: MaxRecordsPerTrigger = None,
    trigger_seconds: TriggerSeconds = 1.0,
    append_records: Annotated[
        int,
        typer.Option(
            min=1,
            help="Records per append of the sink: each append is stored whole, and a crash "
            "between two appends of a task leaves the first stored.",
        ),
    ] = 5000,
    master: Master = None,
) -> None:
    """Copy SOURCE to DESTINATION partition by partition, each record exactly once.

    Runs until stopped (Ctrl-C), or with --until-caught-up until what SOURCE holds now is
    copied. A copy killed at any point resumes from its checkpoint without losing or repeating
    a record.
    """
    from exactly.spark.copy import configured_plan, prepare, run_copy
    from exactly.spark.streaming import checkpoint_lock

    found = with_master(ctx, master)
    settings = found.settings
    plan = configured_plan(
        settings,
        source,
        destination,
        checkpoint=checkpoint,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        starting_offsets=starting_offsets,
        append_records=append_records,
    )
    with found.open_log() as log:
        prepare(log, plan)
    with checkpoint_lock(plan.checkpoint, "exactly copy"):
        from exactly.spark.session import build_session

        spark = build_session(settings, app_name=f"exactly-copy-{source}-{destination}")
        where = place(str(plan.checkpoint), settings.data_dir).removeprefix("file ")
        print(f"copying {source} to {destination}", file=sys.stderr)
        print(fit("  checkpoint", where, "    "), file=sys.stderr)

        def report(batch: int, records: int) -> None:
            if records:
                print(f"batch {batch:,}: {records:,} records", file=sys.stderr, flush=True)

        progress = run_copy(spark, plan, on_batch=report)
        spark.stop()
    batches = sum(1 for records in progress.batches.values() if records)
    print(f"caught up: {progress.records:,} records copied in {batches:,} micro-batches")
