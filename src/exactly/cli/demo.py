"""``exactly demo``: the most complete pipeline that exists so far, on the embedded defaults."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from exactly.cli.context import context
from exactly.demo import run_demo


def demo(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events to generate.", min=1)] = 200_000,
    partitions: Annotated[int, typer.Option(help="Partitions of the demo topic.", min=1)] = 4,
    topic: Annotated[str, typer.Option(help="Topic to write.")] = "demo",
) -> None:
    """Append generated events durably through the log, read them back, print counts and rates."""
    console = Console(soft_wrap=True)
    with context(ctx).open_log() as log:
        console.print(f"log {log.url}: appending {events:,} events to topic {topic!r} ...")
        result = run_demo(log, topic, partitions, events)
    table = Table("partition", "records read")
    for partition, count in result.per_partition.items():
        table.add_row(str(partition), f"{count:,}")
    console.print(table)
    mb = result.bytes_appended / 1e6
    console.print(
        f"appended {result.appended:,} events ({mb:.1f} MB) durably in "
        f"{result.append_seconds:.2f} s: {result.appended / result.append_seconds:,.0f} events/s"
    )
    console.print(
        f"read back {result.read:,} events in {result.read_seconds:.2f} s: "
        f"{result.read / max(result.read_seconds, 1e-9):,.0f} events/s"
    )
    console.print(
        f"resent the last batch of partition 0 with its sequence ids: "
        f"{result.resent_dropped:,} of {result.resent:,} dropped as duplicates"
    )
    exact = result.read == result.appended == result.distinct_ids
    console.print(
        f"check: {result.distinct_ids:,} distinct messageIds, "
        + ("every event once" if exact else "MISMATCH")
    )
    if not exact:
        raise typer.Exit(1)
