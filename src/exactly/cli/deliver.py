"""``exactly deliver``: the director, sending the JobDB's jobs to ``[[destinations]]``."""

from __future__ import annotations

from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.errors import ConfigError

JOBDB = typer.Option(
    "--jobdb",
    help="JobDB: sqlite://DIR, postgresql://USER@HOST/DB or mysql://USER@HOST/DB "
    "(default: sqlite DATA_DIR/jobdb).",
    envvar="EXACTLY_DELIVERY__JOBDB",
)


def deliver(
    ctx: typer.Context,
    jobdb: Annotated[str | None, JOBDB] = None,
    until_drained: Annotated[
        bool,
        typer.Option(
            help="Stop when no job is pending (retries waited for).",
            envvar="EXACTLY_UNTIL_DRAINED",
        ),
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            help="Wait for the director lock if another director holds it (standby).",
            envvar="EXACTLY_DELIVERY_WAIT",
        ),
    ] = True,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve Prometheus metrics at http://127.0.0.1:PORT/metrics "
            "(default: [delivery] metrics_port, off).",
            envvar="EXACTLY_DELIVERY__METRICS_PORT",
            min=1,
            max=65535,
        ),
    ] = None,
) -> None:
    """Deliver queued jobs to their destinations until stopped (SIGTERM) or drained.

    One director per JobDB: a second one waits on the lock and takes over when the first dies.
    Every job is recorded executing before its request leaves, so after a crash only the requests
    that were in flight are sent again, with the same Idempotency-Key and webhook-id.
    """
    from exactly.delivery.archive import open_archive
    from exactly.delivery.director import Director
    from exactly.delivery.jobdb import open_jobdb

    settings = context(ctx).settings
    if not settings.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to deliver to")
    options = settings.delivery
    archive = open_archive(settings.archive_url)
    archive.check()  # a wrong URL or an unreachable bucket stops here, in one line
    with open_jobdb(
        jobdb or settings.jobdb_url,
        dataset_rows=options.dataset_rows,
        dataset_minutes=options.dataset_minutes,
    ) as database:
        director = Director(
            database,
            settings.destinations,
            page_size=options.page_size,
            archive=archive,
            metrics_port=metrics_port or options.metrics_port,
            jobdb_patience=options.jobdb_patience,
        )
        tallies = director.run(until_drained=until_drained, wait=wait)
    for name, tally in tallies.items():
        print(
            f"{name}: {tally.sent} requests, {tally.succeeded} succeeded, {tally.retried} to "
            f"retry, {tally.discarded} discarded, {tally.expired} expired"
            + (f"; last error {tally.last_error}" if tally.last_error else "")
        )
