"""``exactly deliver``: the director, sending the JobDB's jobs to ``[[destinations]]``."""

from __future__ import annotations

from typing import Annotated

import typer

from exactly.cli.context import with_flags
from exactly.cli.output import wrap

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
            help="Wait for a free partition if other directors hold them all (standby).",
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

    Each director leases some of the JobDB's [delivery] partitions and sends only their jobs;
    with every partition held, another one waits and takes over when a holder dies.
    Every job is recorded executing before its request leaves, so after a crash only the requests
    that were in flight are sent again, with the same Idempotency-Key and webhook-id.
    """
    from exactly.delivery.director import configured_director

    flags = {"delivery.jobdb": jobdb, "delivery.metrics_port": metrics_port}
    with configured_director(with_flags(ctx, flags).settings) as director:
        tallies = director.run(until_drained=until_drained, wait=wait)
    for name, tally in tallies.items():
        print(
            wrap(
                f"{name}: {tally.sent:,} requests, {tally.succeeded:,} succeeded, "
                f"{tally.retried:,} to retry, {tally.discarded:,} discarded, "
                f"{tally.expired:,} expired",
                "    ",
            )
        )
        if tally.last_error:
            print(wrap(f"  last error: {' '.join(tally.last_error.split())}", "    "))
