"""``exactly trace MESSAGE_ID``: every hop of one message, as text (80 columns) or JSON."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from exactly.cli.context import context, stop_if_never_ran
from exactly.text import message


def trace(
    ctx: typer.Context,
    message_id: Annotated[str, typer.Argument(help="The messageId to follow.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of text.")
    ] = False,
) -> None:
    """Every hop of one message: accepted (each copy), the dedupe verdict, the micro-batch that
    counted it and each delivery attempt per destination. Exit status 1 for an unknown id.

    Reads the log ([log] url), the aggregate database ([aggregate] url), the JobDB and the
    archive ([delivery] jobdb, archive) by indexes: about a millisecond per store, whatever
    their size. Needs the sqlite log (the Kafka log keeps no index by messageId).
    """
    from exactly.trace import render
    from exactly.trace import trace as follow
    from exactly.urls import embedded_path

    settings = context(ctx).settings
    stop_if_never_ran(settings, (embedded_path(settings.log_url), "exactly collect"))
    found = follow(settings, message_id)
    if as_json:
        print(json.dumps(found.to_json(), indent=1))
    elif found.found:
        print(render(found))
    else:
        print(
            message(f"unknown messageId {message_id!r}: no log record and no delivery job holds it")
        )
    if not found.found:
        raise typer.Exit(1)


__all__ = ["trace"]
