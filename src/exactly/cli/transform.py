"""``exactly transform DEST FILE.jsonl``: what a destination would get for some events, sent
nowhere, so a filter or transform can be tried before it runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from exactly.cli.context import with_flags
from exactly.errors import ConfigError

if TYPE_CHECKING:
    from exactly.delivery.settings import DestinationSettings


def transform(
    ctx: typer.Context,
    destination: Annotated[str, typer.Argument(help="The destination, as in [[destinations]].")],
    events: Annotated[
        Path,
        typer.Argument(help="Events, one JSON object a line, as stored ('-' reads stdin)."),
    ],
) -> None:
    """Print, for each event of FILE, what DESTINATION would get: one JSON line with its
    messageId and an outcome.

    sent (with the body), filtered (its filter, sources or events), skipped (the event's
    integrations object), dropped (its transform returned None) or failed (with the error).
    The filter runs in a local Spark, as the route runs it; the rest in this process. Nothing
    is sent and no JobDB is opened.
    """
    settings = with_flags(ctx, {}).settings
    names = [found.name for found in settings.destinations]
    if destination not in names:
        raise ConfigError(
            f"no destination named {destination!r} in [[destinations]]"
            + (f": use one of {', '.join(names)}" if names else "")
        )
    index = names.index(destination)
    chosen = settings.destinations[index]
    lines = _read(events)
    parsed = [_parse(line, number) for number, line in enumerate(lines, 1)]
    values = [orjson.dumps(event) for event in parsed if isinstance(event, dict)]
    filtered = _filtered(settings, chosen, values)
    shape = _shape(index, chosen)
    at = 0
    for event in parsed:
        if not isinstance(event, dict):
            print(json.dumps({"outcome": "invalid", "error": event}))
            continue
        print(json.dumps(_outcome(chosen, event, values[at], filtered[at], shape)))
        at += 1


def _read(path: Path) -> list[str]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    return [line for line in text.splitlines() if line.strip()]


def _parse(line: str, number: int) -> dict[str, Any] | str:
    """The event on ``line``, or why it is not one."""
    try:
        found = json.loads(line)
    except ValueError as error:
        return f"line {number} is not JSON: {error}"
    if not isinstance(found, dict):
        return f"line {number} is not a JSON object"
    return found


def _filtered(settings: Any, destination: DestinationSettings, values: list[bytes]) -> list[bool]:
    """Whether each event is left out by the destination's sources, events and filter."""
    if destination.filter is None:
        return [
            not destination.matches(event.get("sourceId"), event.get("event"))
            for event in map(orjson.loads, values)
        ]
    from exactly.delivery.choosing import Choosing
    from exactly.spark.session import build_session

    spark = build_session(settings, app_name="exactly-transform", master="local[1]")
    try:
        choosing = Choosing.compile(spark, [destination.model_copy(update={"transform": None})])
        rows = [(value, 0, at) for at, value in enumerate(values)]
        records = spark.createDataFrame(rows, "value binary, partition int, offset long")
        chosen = choosing.parse(records).select("offset", choosing.chosen(0).alias("chosen"))
        found = {row["offset"]: row["chosen"] for row in chosen.collect()}
    finally:
        spark.stop()
    return [not found[at] for at in range(len(values))]


def _shape(index: int, destination: DestinationSettings) -> Any:
    if destination.transform is None:
        return None
    from exactly.delivery.transforms import load, resolve

    return load(resolve(index, destination))


def _outcome(
    destination: DestinationSettings,
    event: dict[str, Any],
    value: bytes,
    filtered: bool,
    shape: Any,
) -> dict[str, Any]:
    from exactly.delivery.integrations import takes
    from exactly.delivery.transforms import DROPPED, SENT, shape_one

    said: dict[str, Any] = {"messageId": event.get("messageId")}
    if filtered:
        return {**said, "outcome": "filtered"}
    if not destination.ignore_integrations and not takes(
        event.get("integrations"), destination.name
    ):
        return {**said, "outcome": "skipped"}
    if shape is None:
        return {**said, "outcome": "sent", "body": event}
    outcome, body, error = shape_one(shape, value)
    if outcome == DROPPED:
        return {**said, "outcome": "dropped"}
    if outcome == SENT and body is not None:
        return {**said, "outcome": "sent", "body": orjson.loads(body)}
    return {**said, "outcome": "failed", "error": error}
