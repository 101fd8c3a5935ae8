"""``exactly trace MESSAGE_ID``: every hop of one message, as text (80 columns) or JSON."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated

import typer

from exactly.cli.context import context, stop_if_never_ran

if TYPE_CHECKING:
    from exactly.trace import Copy, Delivery, Trace


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
        print(f"unknown messageId {message_id!r}: no log record and no delivery job holds it")
    if not found.found:
        raise typer.Exit(1)


def render(found: Trace) -> str:
    """The trace as text, each line within 80 columns (long ids and errors are cut)."""
    lines = [_cut(f"message {found.message_id} (raw partition {found.partition})")]
    lines.append(f"accepted {len(found.copies)} time{'s' if len(found.copies) != 1 else ''}")
    for copy in found.copies:
        lines += _copy(copy)
    if found.counted:
        lines.append("counted")
        for counted in found.counted:
            if counted.batch_id is None:
                lines.append(f"  query {_short(counted.query_id)}: not counted yet")
            else:
                at = "" if counted.exact else "at or before "
                lines.append(
                    _cut(f"  {at}batch {counted.batch_id} of query {_short(counted.query_id)}")
                )
                lines.append(_cut(f"    committed {counted.committed_at}"))
    lines.append(
        f"delivered: {len(found.deliveries)} job(s)" if found.deliveries else "delivered: no jobs"
    )
    for delivery in found.deliveries:
        lines += _delivery(delivery)
    lines += [_cut(f"note: {note}") for note in found.notes]
    return "\n".join(lines)


def _copy(copy: Copy) -> list[str]:
    verdict = copy.verdict
    source = copy.source or "(no source)"
    lines = [
        _cut(
            f"  raw {copy.partition}:{copy.offset}  source {source}  received "
            f"{copy.received_at or '?'}"
        ),
    ]
    if verdict.outcome == "kept":
        text = f"kept -> events {copy.partition}:{verdict.events_offset}"
    elif verdict.outcome == "duplicate" and verdict.duplicate_of is not None:
        text = f"duplicate of raw {copy.partition}:{verdict.duplicate_of}"
    else:
        text = f"{verdict.outcome}: {verdict.reason}"
    lines.append(_cut(f"    dedupe: {text}"))
    return lines


def _delivery(delivery: Delivery) -> list[str]:
    where = " (archived)" if delivery.archived else ""
    lines = [_cut(f"  {delivery.destination}: {delivery.state}, job {delivery.job_id}{where}")]
    for attempt in delivery.attempts:
        status = "" if attempt.status_code is None else f" {attempt.status_code}"
        latency = "" if attempt.latency_ms is None else f" {attempt.latency_ms:.0f} ms"
        error = "" if not attempt.error else f" {' '.join(attempt.error.split())}"
        lines.append(
            _cut(
                f"    #{attempt.attempt} {_when(attempt.started or attempt.finished)} "
                f"{attempt.state}{status}{latency}{error}"
            )
        )
    return lines


def _when(seconds: float) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        + f".{int(seconds * 1000) % 1000:03d}Z"
    )


def _short(text: str) -> str:
    return text if len(text) <= 36 else text[:35] + "…"


def _cut(line: str) -> str:
    return line if len(line) <= 80 else line[:79] + "…"


__all__ = ["render", "trace"]
