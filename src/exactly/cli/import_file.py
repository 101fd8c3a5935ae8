"""``exactly import``: load a JSON-lines file of events into ``raw``, resumably."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

from exactly.cli.context import context
from exactly.collector.importer import import_file as run_import
from exactly.collector.settings import check_source_name
from exactly.errors import ConfigError, InvalidLines
from exactly.text import message

MAX_LISTED = 100


def import_file(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Argument(help="JSON-lines file, one event per line; may be gzipped.")
    ],
    source: Annotated[
        str,
        typer.Option(help="Source name stored with each event as sourceId.", show_default=False),
    ],
    topic: Annotated[str, typer.Option(help="Topic the events go to.")] = "raw",
    partitions: Annotated[
        int, typer.Option(help="Partitions of the topic if it is created.", min=1)
    ] = 8,
    batch: Annotated[int, typer.Option(help="Lines per durable append.", min=1)] = 5000,
    producer: Annotated[
        str | None,
        typer.Option(
            help="Producer name to resume under (default: from source and file).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Import FILE into the log; run it again after a crash: no line is lost or logged twice."""
    try:
        check_source_name(source)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    err = Console(stderr=True)
    listed = 0

    def on_invalid(number: int, reason: str) -> None:
        nonlocal listed
        listed += 1
        if listed <= MAX_LISTED:
            said = message(f"{file}:{number}: {reason}")
            err.print(said, markup=False, highlight=False, soft_wrap=True)

    size = file.stat().st_size if file.exists() else 0
    with context(ctx).open_log() as log:
        run = partial(
            run_import,
            log,
            file,
            source,
            topic=topic,
            partitions=partitions,
            batch_lines=batch,
            producer=producer,
            on_invalid=on_invalid,
        )
        if sys.stderr.isatty():
            with Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            ) as progress:
                task = progress.add_task(f"importing {file.name}", total=size)
                report = run(on_progress=lambda done: progress.update(task, completed=done))
        else:
            report = run()
    if listed > MAX_LISTED:
        err.print(
            f"... and {listed - MAX_LISTED:,} more invalid lines", markup=False, soft_wrap=True
        )
    print(message(report.summary(topic)), file=sys.stderr)
    if report.invalid:
        raise InvalidLines(
            f"{report.invalid:,} invalid lines in {file} (listed above) were not imported; "
            "fix them and import those lines from a new file"
        )
