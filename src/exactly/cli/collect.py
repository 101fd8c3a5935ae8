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

from exactly.cli.context import context, with_flags
from exactly.errors import UnknownTopic
from exactly.text import message


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
    if source:
        warning = (
            "warning: write keys given with --source are visible to other users in ps; "
            "put them in [collector.sources] or EXACTLY_COLLECTOR__SOURCES"
        )
        print(message(warning), file=sys.stderr)
    flags = {
        "collector.host": host,
        "collector.port": port,
        "collector.workers": workers,
        "collector.sources": source or None,
        "collector.topic": topic,
        "collector.partitions": partitions,
        "collector.max_queue_mb": max_queue_mb,
    }
    settings = with_flags(ctx, flags).settings
    config = settings.collector
    # its validator also refuses a record limit below the event limit (ConfigError)
    from exactly.forget.regulations import key_path, load_key

    load_key(settings.data_dir)  # made here once, so that every worker reads the same key
    collector = config.worker_settings(
        settings.log_url, settings.log.max_record_bytes, str(key_path(settings.data_dir))
    )
    host, port, workers, topic = config.host, config.port, config.workers, config.topic
    with context(ctx).open_log() as log:  # fail here, in one line, rather than in each worker
        try:
            count = log.topic_info(topic).partitions
        except UnknownTopic:
            count = log.create_topic(topic, collector.partitions, exist_ok=True).partitions
    from exactly.collector.server import check_address, serve

    check_address(host, port)
    names = ", ".join(s.name for s in collector.sources)
    from exactly.cli.output import fit, place, wrap

    print(
        f"collecting on http://{host}:{port} into {topic} ({count:,} partitions)\n"
        + fit("  log", place(settings.log_url, settings.data_dir), "    ")
        + "\n"
        + wrap(f"  sources: {names}; {workers} worker{'s' if workers > 1 else ''}", "    "),
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
        max_connections_per_address=config.max_connections_per_address,
    )
