"""``exactly deliveries``: per destination, what is queued, retrying, delivered and why not."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Column

from exactly.cli.context import stop_if_never_ran, with_flags
from exactly.cli.deliver import JOBDB
from exactly.cli.output import console, count, table, wrap
from exactly.config import Settings
from exactly.delivery.jobdb import opened_jobdb
from exactly.errors import ConfigError
from exactly.units import format_duration
from exactly.urls import embedded_path

if TYPE_CHECKING:
    from exactly.delivery.jobdb.base import Summary
    from exactly.delivery.jobdb.faces import JobReader

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
    whether sending is paused, last error; and, when a destination filters or transforms,
    the events not sent to it: filtered (its filter, sources or events), skipped (the event's
    integrations object), dropped (its transform returned None), failed (its transform
    failed; shown by exactly trace).

    Counts are events: a batch the route query made counts its events. Read from the JobDB's
    live datasets; jobs of archived (dropped) datasets are not counted. The
    rate is the deliveries of the last minute per second, beside the destination's ``rate`` limit.
    A destination is "paused" by an operator (``exactly deliveries pause``) or "failing since"
    a time when its breaker opened after consecutive failures (it is probed until it answers).
    """
    if ctx.invoked_subcommand is not None:
        return
    from exactly.delivery.jobdb.base import Summary

    settings = with_flags(ctx, {"delivery.jobdb": jobdb}).settings
    url = settings.jobdb_url
    stop_if_never_ran(settings, (_jobdb_file(url), "exactly route"))
    database: JobReader
    with opened_jobdb(url) as database:
        found = database.summary(time.time())
        directors = database.directors()
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
    _print_table(found, limits)
    if directors:
        console().print()
        _print_directors(directors, settings.delivery.partitions)


def _print_directors(directors: list[tuple[str, list[int], float]], partitions: int) -> None:
    """Each director's heartbeat: the partitions it holds, how long ago it was last seen (a
    director not seen for STALE seconds is counted out by the others)."""
    from exactly.delivery.jobdb.base import STALE

    now = time.time()
    shown = table(
        Column("director", overflow="fold"),
        Column("partitions", overflow="fold"),
        Column("last seen", justify="right", no_wrap=True),
    )
    for name, held, seen in directors:
        ago = max(0.0, now - seen)
        stale = " (gone?)" if ago > STALE else ""
        shown.add_row(name, _ranges(held) or "none", f"{ago:,.0f} s ago{stale}")
    out = console()
    out.print(f"directors ({len(directors):,}) sharing {count(partitions)} partitions:")
    out.print(shown)


def _ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@app.command()
def directors(
    ctx: typer.Context,
    jobdb: Annotated[str | None, JOBDB] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The directors delivering from the JobDB: partitions held, when last seen."""
    settings = with_flags(ctx, {"delivery.jobdb": jobdb}).settings
    url = settings.jobdb_url
    stop_if_never_ran(settings, (_jobdb_file(url), "exactly route"))
    database: JobReader
    with opened_jobdb(url) as database:
        found = database.directors()
    if as_json:
        rows = [{"director": n, "partitions": p, "seen_at": s} for n, p, s in found]
        print(json.dumps(rows, indent=1))
    elif found:
        _print_directors(found, settings.delivery.partitions)
    else:
        print("no director is delivering from this JobDB")


def _print_table(found: dict[str, Summary], limits: dict[str, float | None]) -> None:
    """Two tables within 80 columns: the jobs by state, then the flow (rate, sending, error)."""
    from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED

    states = table(
        "destination",
        *(
            Column(header, justify="right")
            for header in ("queued", "retrying", "succeeded", "discarded", "expired")
        ),
        Column("oldest queued", justify="right"),
    )
    flow = table(
        Column("destination", no_wrap=True),
        Column("rate", no_wrap=True),
        Column("sending", no_wrap=True),
        Column("last error", overflow="fold"),
    )
    for name, entry in sorted(found.items()):
        age = entry.oldest_pending_seconds
        states.add_row(
            name,
            count(entry.queued),
            *(
                count(entry.states.get(state, 0))
                for state in (AWAITING_RETRY, SUCCEEDED, DISCARDED, EXPIRED)
            ),
            "-" if age is None else format_duration(round(age * 1000)),
        )
        limit = limits.get(name)
        flow.add_row(
            name,
            f"{entry.rate_per_second:,.1f}/s" + ("" if limit is None else f" (max {limit:,g})"),
            entry.sending,
            " ".join((entry.last_error or "").split())[:120],
        )
    shown = console()
    shown.print(states)
    shown.print()
    shown.print(flow)
    chosen = _chosen_table(found)
    if chosen is not None:
        shown.print()
        shown.print(chosen)


def _chosen_table(found: dict[str, Summary]) -> Any:
    """What routing did not send, by why, when any destination filters or transforms."""
    from exactly.delivery.jobdb.base import FAILED

    rows = [
        (name, entry.states.get(FAILED, 0), entry.withheld) for name, entry in sorted(found.items())
    ]
    if not any(failed or withheld for _, failed, withheld in rows):
        return None
    chosen = table(
        "destination",
        *(
            Column(header, justify="right")
            for header in ("filtered", "skipped", "dropped", "failed")
        ),
    )
    for name, failed, withheld in rows:
        chosen.add_row(
            name,
            count(withheld.filtered),
            count(withheld.skipped),
            count(withheld.dropped),
            count(failed),
        )
    return chosen


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
        print(wrap(operators.pause(database, destination), "  "))


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
        print(wrap(operators.resume(database, destination), "  "))


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
        line = operators.expire(
            database, destination, when, partitions=settings.delivery.partitions
        )
        print(wrap(line, "  "))
