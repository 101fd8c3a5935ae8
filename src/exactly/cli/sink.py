"""``exactly sink``: which streaming query's sink owns a topic, and handing a topic over."""

from __future__ import annotations

from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.cli.output import wrap

app = typer.Typer(
    help="Which streaming query writes a topic through the exactly-once sink.",
    no_args_is_help=True,
)


@app.command()
def owner(ctx: typer.Context, topic: str) -> None:
    """Print the sink that owns TOPIC (its query's checkpoint), or that none does."""
    from exactly.spark.datasource import lease

    with context(ctx).open_log() as log:
        log.topic_info(topic)
        found = lease.holder(log, topic)
    if found is None:
        print(f"topic {topic}: no sink owns it")
    else:
        print(wrap(f"topic {topic}: owned by {found.describe()}", "  "))


@app.command()
def release(
    ctx: typer.Context,
    topic: str,
    sink: Annotated[
        str | None, typer.Option(help="Release only if this sink id owns the topic.")
    ] = None,
) -> None:
    """Release TOPIC from the sink that owns it, so another query may write it.

    Stop the owning query first, for good: if it ran again it would be refused.
    """
    from exactly.spark.datasource import lease

    with context(ctx).open_log() as log:
        log.topic_info(topic)
        released = lease.release(log, topic, sink)
    if released is None:
        print(f"topic {topic}: nothing to release" + (f" for sink {sink}" if sink else ""))
    else:
        print(wrap(f"topic {topic}: released from {released.describe()}", "  "))
