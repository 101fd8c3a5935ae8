"""``exactly demo``: the whole pipeline, collector to aggregates and deliveries, embedded."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.cli.output import console as narrow
from exactly.cli.output import wrap


def demo(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Distinct events the clients send.", min=1)] = 100_000,
    partitions: Annotated[
        int, typer.Option(help="Partitions of raw and events (when created).", min=1)
    ] = 4,
) -> None:
    """Run `exactly up` and send it generated events (with client retries); check every stage.

    Prints the aggregates, the duplicates dropped, the audit (a recount from events) and what a
    local receiver failing a fifth of the time got per destination; exits 1 if the audit or the
    deliveries differ from the events. Everything lives under the data dir; a rerun adds to it.
    """
    from exactly.aggregate.audit import render
    from exactly.aggregate.spec import EVENT_COUNTS
    from exactly.cli.aggregate import print_counts
    from exactly.cli.lake import show_rows
    from exactly.delivery import demo as delivery
    from exactly.demo import LAKE_QUERY, STATS_ROWS, run_pipeline

    console = narrow()
    settings = context(ctx).settings
    result = run_pipeline(settings, events, partitions, lambda line: print(line, file=sys.stderr))
    traffic = result.traffic
    console.print("event counts by hour (exactly stats; --by minute for minutes):")
    print_counts(result.stats, "hour", console, limit=STATS_ROWS)
    seconds = result.seconds
    rate = traffic.events / max(traffic.seconds, 1e-9)
    for line in (
        f"sent {traffic.events:,} events in {traffic.requests:,} batch requests in "
        f"{seconds['collect']:.1f} s ({rate:,.0f} events/s):",
        f"  {traffic.distinct:,} distinct, {traffic.resent:,} sent twice by retrying clients",
        f"dedupe: {result.raw:,} records in raw -> {result.events:,} events, "
        f"{result.duplicates_dropped:,} duplicates dropped",
        f"aggregate: {result.counted:,} events counted into event_counts;",
        f"  all stages done {seconds['pipeline']:.1f} s after exactly up started",
    ):
        console.print(wrap(line, "    "), highlight=False)
    for line in render(result.audit, [EVENT_COUNTS]):
        console.print(line, highlight=False)
    for line in delivery.lines(result.received):
        console.print(line, highlight=False)
    lake = result.lake
    if lake is not None:
        verdict = "as in events: exact" if lake.exact else f"events {lake.events:,}: MISMATCH"
        console.print(
            wrap(f"lake: {lake.rows:,} rows, {lake.distinct:,} distinct messageIds, {verdict}"),
            highlight=False,
        )
        console.print("the lake queried with DuckDB (exactly lake sql QUERY):", highlight=False)
        console.print(wrap(f"  {LAKE_QUERY}", "    "), highlight=False)
        sys.stdout.flush()
        show_rows(lake.by_event, "table", STATS_ROWS)
        if lake.segment:
            console.print("and Segment's tables beside it (docs/segment.md):", highlight=False)
        for text, rows in lake.segment:
            console.print(wrap(f"  {text}", "    "), highlight=False)
            sys.stdout.flush()
            show_rows(rows, "table", STATS_ROWS)
    exact = (
        result.audit.exact
        and result.events == traffic.distinct
        and result.counted == result.events
        and delivery.exact(result.received)
        and (lake is None or lake.exact)
    )
    if result.events != traffic.distinct or result.counted != result.events:
        console.print(
            wrap(
                f"MISMATCH: {traffic.distinct:,} distinct events sent, {result.events:,} kept, "
                f"{result.counted:,} counted"
            )
        )
    if not exact:
        raise typer.Exit(1)
