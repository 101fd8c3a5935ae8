"""``exactly deliveries``: per destination, what is queued, retrying, delivered and why not."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

from exactly.cli.context import stop_if_never_ran, with_flags
from exactly.cli.deliver import JOBDB, opened_jobdb
from exactly.config import Settings
from exactly.errors import ConfigError
from exactly.urls import embedded_path

app = typer.Typer(
    help="What is queued and delivered per destination; pause, resume or expire one.",
    invoke_without_command=True,
    no_args_is_help=False,
)


@app.callback()
def deliveries(
    ctx: typer.Context,
    jobdb: Annotated[str | None, JOBDB] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Per destination: queued, retrying, succeeded, discarded, expired, oldest queued, rate,
    whether sending is paused, last error.

    Read from the JobDB's live datasets; jobs of archived (dropped) datasets are not counted. The
    rate is the deliveries of the last minute per second, beside the destination's ``rate`` limit.
    A destination is "paused" by an operator (``exactly deliveries pause``) or "failing since"
    a time when its breaker opened after consecutive failures (it is probed until it answers).
    """
    if ctx.invoked_subcommand is not None:
        return
    from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED, Summary

    settings = with_flags(ctx, {"delivery.jobdb": jobdb}).settings
    url = settings.jobdb_url
    stop_if_never_ran(settings, (_jobdb_file(url), "exactly route"))
    with opened_jobdb(url) as database:
        found = database.summary(time.time())
    for destination in settings.destinations:
        found.setdefault(destination.name, Summary(destination.name, {}))
    limits = {destination.name: destination.rate for destination in settings.destinations}
    if as_json:
        rows = [
            {
                **asdict(entry),
                "queued": entry.queued,
                "rate_per_second": round(entry.rate_per_second, 3),
                "rate_limit": limits.get(name),
                "sending": entry.sending,
            }
            for name, entry in sorted(found.items())
        ]
        print(json.dumps(rows, indent=1))
        return
    widest = max((len(name) for name in found), default=11)
    table = Table(
        Column("destination", no_wrap=True, min_width=widest),
        *(
            Column(header, justify="right", no_wrap=True, min_width=len(header))
            for header in (
                "queued",
                "retrying",
                "succeeded",
                "discarded",
                "expired",
                "oldest queued",
                "rate",
                "sending",
            )
        ),
        Column("last error", overflow="fold", min_width=10),
    )
    for name, entry in sorted(found.items()):
        age = entry.oldest_pending_seconds
        table.add_row(
            name,
            str(entry.queued),
            str(entry.states.get(AWAITING_RETRY, 0)),
            str(entry.states.get(SUCCEEDED, 0)),
            str(entry.states.get(DISCARDED, 0)),
            str(entry.states.get(EXPIRED, 0)),
            "-" if age is None else f"{age:.0f} s",
            f"{entry.rate_per_second:.1f}/s"
            + ("" if limits.get(name) is None else f" (max {limits[name]:g})"),
            entry.sending,
            (entry.last_error or "")[:40],
        )
    # piped output is not cut to 80 columns; a terminal keeps its own width
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160).print(table)


def _jobdb_file(url: str) -> Path | None:
    """The embedded JobDB's file, which opening it would create; None for a server."""
    from exactly.delivery.jobdb.sqlite import FILE

    directory = embedded_path(url) if url.startswith("sqlite://") else None
    return None if directory is None else directory / FILE


DESTINATION = typer.Argument(help="The destination's name, as in [[destinations]].")


def _known(ctx: typer.Context, name: str, jobdb: str | None) -> Settings:
    """The settings (--jobdb over its setting), when they name destination ``name``."""
    settings = with_flags(ctx, {"delivery.jobdb": jobdb}).settings
    names = [destination.name for destination in settings.destinations]
    if name not in names:
        raise ConfigError(
            f"no destination named {name!r} in [[destinations]]"
            + (f": use one of {', '.join(names)}" if names else "")
        )
    return settings


@app.command()
def pause(
    ctx: typer.Context,
    destination: Annotated[str, DESTINATION],
    jobdb: Annotated[str | None, JOBDB] = None,
) -> None:
    """Stop sending to a destination until it is resumed.

    Its jobs wait. It takes effect within a second, whether a director runs or not.
    """
    from exactly.delivery import operators

    settings = _known(ctx, destination, jobdb)
    with opened_jobdb(settings.jobdb_url) as database:
        print(operators.pause(database, destination))


@app.command()
def resume(
    ctx: typer.Context,
    destination: Annotated[str, DESTINATION],
    jobdb: Annotated[str | None, JOBDB] = None,
) -> None:
    """Send to a paused destination again."""
    from exactly.delivery import operators

    settings = _known(ctx, destination, jobdb)
    with opened_jobdb(settings.jobdb_url) as database:
        print(operators.resume(database, destination))


@app.command()
def expire(
    ctx: typer.Context,
    destination: Annotated[str, DESTINATION],
    before: Annotated[
        str | None,
        typer.Option(
            help="Only jobs created before this time: 2026-11-23T10:00:00Z (UTC when no zone is "
            "given), a date, or a duration back from now (6h, 2d). Default: now, every pending "
            "job.",
        ),
    ] = None,
    jobdb: Annotated[str | None, JOBDB] = None,
) -> None:
    """Expire a destination's pending jobs, a backlog nobody wants delivered any more.

    They are archived like any finished job and can be sent again with exactly replay --state
    expired. Jobs whose request is out finish first.
    """
    from exactly.delivery import operators
    from exactly.delivery.replay import parse_time

    settings = _known(ctx, destination, jobdb)
    now = time.time()
    when = parse_time(before, now, "--before") or now
    with opened_jobdb(settings.jobdb_url) as database:
        print(operators.expire(database, destination, when))
