"""``exactly deliveries``: per destination, what is queued, retrying, delivered and why not."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Column, Table

from exactly.cli.context import context
from exactly.cli.deliver import JOBDB, opened_jobdb


def deliveries(
    ctx: typer.Context,
    jobdb: Annotated[str | None, JOBDB] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Per destination: queued, retrying, succeeded, discarded, expired, oldest queued, rate, last
    error.

    Read from the JobDB's live datasets; jobs of archived (dropped) datasets are not counted. The
    rate is the deliveries of the last minute per second, beside the destination's ``rate`` limit.
    """
    from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED, Summary

    settings = context(ctx).settings
    with opened_jobdb(jobdb or settings.jobdb_url) as database:
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
            (entry.last_error or "")[:40],
        )
    # piped output is not cut to 80 columns; a terminal keeps its own width
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160).print(table)
