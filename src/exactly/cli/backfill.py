"""``exactly backfill DEST``: the events already in ``events`` to one destination, each once."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from exactly.cli.context import with_flags
from exactly.cli.deliver import JOBDB
from exactly.cli.options import Master

TIME = (
    "2026-11-23T10:00:00Z (UTC when no zone is given), a date, or a duration back from now (6h, 2d)"
)


def backfill(
    ctx: typer.Context,
    destination: Annotated[str, typer.Argument(help="The destination, as in [[destinations]].")],
    since: Annotated[
        str | None, typer.Option(help=f"Only events received at or after this time: {TIME}.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Only events received before this time (same forms as --since)."),
    ] = None,
    master: Master = None,
    jobdb: Annotated[str | None, JOBDB] = None,
    topic: Annotated[str, typer.Option(help="The deduplicated topic to read.")] = "events",
    chunk: Annotated[
        int, typer.Option(min=1, max=1_000_000, help="Records read per chunk (one Spark job).")
    ] = 50_000,
    wait: Annotated[
        float,
        typer.Option(
            min=0.0, help="Seconds to wait for the route query to start routing DESTINATION."
        ),
    ] = 60.0,
    allow_unordered: Annotated[
        bool,
        typer.Option(
            help="Backfill an ordered destination: its history then arrives after newer events."
        ),
    ] = False,
) -> None:
    """Route the events already in TOPIC, received in [--since, --until), to DESTINATION alone,
    through its filter, integrations rule and transform.

    It sends what came before the route query started routing DESTINATION, and runs beside the
    pipeline. Each event gets one job however often backfill runs, is killed, or overlaps the
    live route: a run that is stopped goes on where it stopped when run again. No other
    destination gets anything. `exactly deliver` (or `up`) sends the jobs.
    """
    from exactly.delivery.backfill import configured_plan, drive, say_line
    from exactly.delivery.jobdb import opened_jobdb
    from exactly.delivery.replay import parse_time
    from exactly.log import open_log
    from exactly.spark.session import build_session

    settings = with_flags(ctx, {"delivery.jobdb": jobdb}, master=master).settings
    now = time.time()
    plan = configured_plan(
        settings,
        destination,
        since=parse_time(since, now, "--since"),
        until=parse_time(until, now, "--until"),
        topic=topic,
        chunk_records=chunk,
        wait_seconds=wait,
        allow_unordered=allow_unordered,
    )
    options = settings.delivery
    with (
        open_log(settings.log_url) as log,
        opened_jobdb(
            settings.jobdb_url,
            dataset_rows=options.dataset_rows,
            dataset_minutes=options.dataset_minutes,
        ) as database,
    ):
        log.topic_info(topic)  # a missing topic fails here, before Spark starts
        spark = build_session(settings, app_name=f"exactly-backfill-{destination}")
        try:
            done = drive(spark, plan, database, log, say=say_line)
        finally:
            spark.stop()
    print(done.line())
