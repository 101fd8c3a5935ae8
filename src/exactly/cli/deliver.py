"""``exactly deliver``: the director, sending the JobDB's jobs to ``[[destinations]]``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer

from exactly.cli.context import with_flags
from exactly.cli.output import wrap
from exactly.errors import ConfigError, ExactlyError
from exactly.urls import scrub

if TYPE_CHECKING:
    from exactly.delivery.jobdb.base import JobDB

JOBDB = typer.Option(
    "--jobdb",
    help="JobDB: sqlite://DIR, postgresql://USER@HOST/DB or mysql://USER@HOST/DB "
    "(default: sqlite DATA_DIR/jobdb).",
    envvar="EXACTLY_DELIVERY__JOBDB",
)


@contextlib.contextmanager
def opened_jobdb(url: str, **options: Any) -> Iterator[JobDB]:
    """The JobDB at ``url``, connected once before any work: a database that does not exist, a
    wrong password or a server that does not answer stops the command with one line naming the
    JobDB (password masked) and the driver's reason, not the driver's traceback."""
    from exactly.delivery.jobdb import open_jobdb
    from exactly.errors import JobDBError

    database = open_jobdb(url, **options)
    try:
        database.datasets()  # the first use connects (and creates the tables)
    except ExactlyError:
        database.close()
        raise
    except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
        with contextlib.suppress(Exception):
            database.close()
        raise JobDBError(
            f"cannot open the JobDB {database.describe()}: {_reason(error, url)}; check its URL "
            "(--jobdb, EXACTLY_DELIVERY__JOBDB or [delivery] jobdb), that the server runs and "
            "that the database exists"
        ) from None
    with database:
        yield database


def _reason(error: Exception, url: str) -> str:
    """The driver's message on one line, without the password it might quote."""
    args = error.args
    text = args[1] if len(args) == 2 and isinstance(args[0], int) else str(error)  # PyMySQL's
    try:
        secrets = [urlsplit(url).password or ""]
    except ValueError:
        secrets = []
    return " ".join(scrub(str(text) or type(error).__name__, secrets).split())[:300]


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
    from exactly.delivery.archive import open_archive
    from exactly.delivery.director import Director

    flags = {"delivery.jobdb": jobdb, "delivery.metrics_port": metrics_port}
    settings = with_flags(ctx, flags).settings
    if not settings.destinations:
        raise ConfigError("no [[destinations]] in the config: nothing to deliver to")
    options = settings.delivery
    archive = open_archive(settings.archive_url)
    archive.check()  # a wrong URL or an unreachable bucket stops here, in one line
    with opened_jobdb(
        settings.jobdb_url,
        dataset_rows=options.dataset_rows,
        dataset_minutes=options.dataset_minutes,
    ) as database:
        director = Director(
            database,
            settings.destinations,
            page_size=options.page_size,
            archive=archive,
            metrics_port=options.metrics_port,
            jobdb_patience=options.jobdb_patience,
            partitions=options.partitions,
        )
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
