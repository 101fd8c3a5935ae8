"""``exactly collect``: serve the Segment-compatible tracking API into the ``raw`` topic."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from exactly.cli.context import context
from exactly.collector.settings import CollectorSettings, parse_source
from exactly.errors import ConfigError, UnknownTopic
from exactly.urls import redact


def collect(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on.", envvar="EXACTLY_COLLECTOR__HOST")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to listen on.", envvar="EXACTLY_COLLECTOR__PORT")
    ] = 8088,
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes, each with its own appender.",
            envvar="EXACTLY_COLLECTOR__WORKERS",
            min=1,
        ),
    ] = 1,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="A source as NAME=WRITE_KEY; repeat for several. "
            "Env: EXACTLY_COLLECTOR__SOURCES, comma-separated.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str, typer.Option(help="Topic the events go to.", envvar="EXACTLY_COLLECTOR__TOPIC")
    ] = "raw",
    partitions: Annotated[
        int,
        typer.Option(
            help="Partitions of the topic when it is created (an existing topic keeps its own).",
            envvar="EXACTLY_COLLECTOR__PARTITIONS",
            min=1,
        ),
    ] = 8,
    max_queue_mb: Annotated[
        int,
        typer.Option(
            help="Events waiting for the log, per worker, beyond which requests get 503.",
            envvar="EXACTLY_COLLECTOR__MAX_QUEUE_MB",
            min=1,
        ),
    ] = 64,
) -> None:
    """Serve the tracking API (POST /v1/track, /v1/batch, ...); 200 only once events are durable."""
    given = list(source or [])
    if not given and os.environ.get("EXACTLY_COLLECTOR__SOURCES"):
        given = [part for part in os.environ["EXACTLY_COLLECTOR__SOURCES"].split(",") if part]
    if not given:
        raise ConfigError(
            "no source: give at least one --source NAME=WRITE_KEY (or EXACTLY_COLLECTOR__SOURCES)"
        )
    sources = tuple(parse_source(text) for text in given)
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ConfigError("two sources have the same name")
    keys = [s.write_key.get_secret_value() for s in sources]
    if len(set(keys)) != len(keys):
        raise ConfigError("two sources have the same write key")
    settings = context(ctx).settings
    collector = CollectorSettings(
        log_url=settings.log_url,
        max_record_bytes=settings.log.max_record_bytes,
        topic=topic,
        partitions=partitions,
        sources=sources,
        max_pending_bytes=max_queue_mb * 1024 * 1024,
    )
    with context(ctx).open_log() as log:  # fail here, in one line, rather than in each worker
        try:
            partitions = log.describe(topic).partitions
        except UnknownTopic:
            partitions = log.create_topic(topic, partitions, exist_ok=True).partitions
    from exactly.collector.server import check_address, serve

    check_address(host, port)
    print(
        f"collecting on http://{host}:{port} into {topic} ({partitions} partitions) of "
        f"{redact(settings.log_url)} "
        f"(sources: {', '.join(names)}; {workers} worker{'s' if workers > 1 else ''})",
        file=sys.stderr,
        flush=True,
    )
    serve(collector, host, port, workers)
