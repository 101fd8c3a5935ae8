"""``exactly collect``: serve the Segment-compatible tracking API into the ``raw`` topic.

Every option falls back to ``[collector]`` in the config file and its ``EXACTLY_COLLECTOR__*``
variables. Write keys come from there too (``[collector.sources]``, or
``EXACTLY_COLLECTOR__SOURCES=web=KEY1,ios=KEY2``): a key given with ``--source NAME=KEY`` works
but is visible to every user of the machine in ``ps``, and the command says so.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from pydantic import SecretStr, ValidationError

from exactly.cli.context import context
from exactly.collector.settings import (
    BYTE_BURST,
    CollectorSettings,
    RateLimit,
    Source,
    parse_source,
)
from exactly.errors import ConfigError, UnknownTopic
from exactly.log.base import check_topic_name
from exactly.urls import redact


def collect(
    ctx: typer.Context,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on [collector.host; default 127.0.0.1].")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to listen on [collector.port; default 8088].")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Worker processes, each with its own appender [collector.workers].", min=1
        ),
    ] = None,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            help="A source as NAME=WRITE_KEY, repeatable. Prefer [collector.sources] in the "
            "config or EXACTLY_COLLECTOR__SOURCES=NAME=KEY,...: keys on the command line show in "
            "ps.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str | None, typer.Option(help="Topic the events go to [collector.topic; default raw].")
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            help="Partitions of the topic when it is created (an existing topic keeps its own) "
            "[collector.partitions; default 8].",
            min=1,
        ),
    ] = None,
    max_queue_mb: Annotated[
        int | None,
        typer.Option(
            help="Events waiting for the log, per worker, beyond which requests get 503 "
            "[collector.max_queue_mb; default 64].",
            min=1,
        ),
    ] = None,
) -> None:
    """Serve the tracking API (POST /v1/track, /v1/batch, ...); 200 only once events are durable.

    Every option also comes from [collector] in the config file or EXACTLY_COLLECTOR__<NAME>.
    """
    settings = context(ctx).settings
    config = settings.collector
    host = config.host if host is None else host
    port = config.port if port is None else port
    workers = config.workers if workers is None else workers
    topic = config.topic if topic is None else topic
    check_topic_name(topic)
    sources = _sources(source, config.sources)
    for setting in ("allowed_origins", "rate_limits", "byte_limits"):
        unknown = sorted(set(getattr(config, setting)) - {s.name for s in sources})
        if unknown:
            raise ConfigError(
                f"collector.{setting} names {', '.join(unknown)}, which is not a source: "
                "use the names of [collector.sources]"
            )
    try:  # its validator also refuses a record limit below the event limit (ConfigError)
        collector = CollectorSettings(
            log_url=settings.log_url,
            max_record_bytes=settings.log.max_record_bytes,
            topic=topic,
            partitions=config.partitions if partitions is None else partitions,
            sources=sources,
            max_pending_bytes=(config.max_queue_mb if max_queue_mb is None else max_queue_mb)
            * 1024
            * 1024,
            max_event_bytes=config.max_event_bytes,
            max_buffered_bytes=config.max_buffered_mb * 1024 * 1024,
            max_append_bytes=int(config.max_append_mb * 1024 * 1024),
            read_timeout_seconds=config.read_timeout,
            body_timeout_seconds=config.body_timeout,
            allowed_origins=config.allowed_origins,
            rate_limits={
                s.name: RateLimit(per_second=rate, burst=config.rate_limit_burst)
                for s in sources
                if (rate := config.rate_limit_of(s.name)) > 0
            },
            max_expansion=config.max_expansion,
            byte_limits={
                s.name: RateLimit(per_second=rate, burst=max(10 * rate, BYTE_BURST))
                for s in sources
                if (rate := config.byte_limit_of(s.name)) > 0
            },
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"collector setting {where}: {first['msg']}") from None
    with context(ctx).open_log() as log:  # fail here, in one line, rather than in each worker
        try:
            count = log.topic_info(topic).partitions
        except UnknownTopic:
            count = log.create_topic(topic, collector.partitions, exist_ok=True).partitions
    from exactly.collector.server import check_address, serve

    check_address(host, port)
    names = ", ".join(s.name for s in sources)
    print(
        f"collecting on http://{host}:{port} into {topic} ({count} partitions) of "
        f"{redact(settings.log_url)} "
        f"(sources: {names}; {workers} worker{'s' if workers > 1 else ''})",
        file=sys.stderr,
        flush=True,
    )
    serve(
        collector,
        host,
        port,
        workers,
        shutdown_timeout=config.shutdown_timeout,
        idle_timeout=config.idle_timeout,
        max_connections=config.max_connections,
    )


def _sources(given: list[str] | None, configured: dict[str, SecretStr]) -> tuple[Source, ...]:
    """The sources from --source when given (with a warning), else from the settings."""
    if given:
        print(
            "warning: write keys given with --source are visible to other users in ps; "
            "put them in [collector.sources] or EXACTLY_COLLECTOR__SOURCES",
            file=sys.stderr,
        )
        sources = tuple(parse_source(text) for text in given)
    else:
        sources = tuple(Source(name=name, write_key=key) for name, key in configured.items())
    if not sources:
        raise ConfigError(
            "no source: add write keys under [collector.sources] in exactly.toml "
            '(web = "KEY") or set EXACTLY_COLLECTOR__SOURCES=web=KEY'
        )
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ConfigError("two sources have the same name")
    keys = [s.write_key.get_secret_value() for s in sources]
    if len(set(keys)) != len(keys):
        raise ConfigError("two sources have the same write key")
    return sources
