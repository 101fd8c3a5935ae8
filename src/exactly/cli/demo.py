"""``exactly demo``: the whole pipeline so far, collector to aggregates, on embedded defaults."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.console import Console

from exactly.cli.context import context


def demo(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Distinct events the clients send.", min=1)] = 100_000,
    partitions: Annotated[
        int, typer.Option(help="Partitions of raw and events (when created).", min=1)
    ] = 4,
) -> None:
    """Send generated events (with client retries) through collector, dedupe and aggregate.

    Prints the aggregates, the duplicates dropped and the audit (a recount from events); exits 1
    if the audit finds a difference. Everything lives under the data dir; a rerun adds to it.
    """
    from exactly.aggregate.audit import render
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.cli.aggregate import print_counts
    from exactly.demo import run_pipeline

    console = Console(soft_wrap=True)
    settings = context(ctx).settings
    result = run_pipeline(settings, events, partitions, lambda line: print(line, file=sys.stderr))
    traffic = result.traffic
    console.print("event counts by hour (exactly stats; --by minute for minutes):")
    print_counts(result.stats, "hour", console)
    seconds = result.seconds
    console.print(
        f"sent {traffic.events:,} events in {traffic.requests:,} batch requests "
        f"({traffic.distinct:,} distinct; {traffic.resent:,} sent twice by retrying clients) in "
        f"{seconds['collect']:.1f} s: {traffic.events / max(traffic.seconds, 1e-9):,.0f} events/s"
    )
    console.print(
        f"dedupe: {result.raw:,} records in raw -> {result.events:,} events, "
        f"{result.duplicates_dropped:,} duplicates dropped ({seconds['dedupe']:.1f} s)"
    )
    console.print(
        f"aggregate: {result.counted:,} events counted into event_counts "
        f"({seconds['aggregate']:.1f} s)"
    )
    for line in render(result.audit, [EVENT_COUNTS]):
        console.print(line, highlight=False)
    exact = result.audit.exact and result.events == traffic.distinct
    if result.events != traffic.distinct:
        console.print(
            f"MISMATCH: {traffic.distinct:,} distinct events sent, {result.events:,} kept"
        )
    if not exact:
        raise typer.Exit(1)
