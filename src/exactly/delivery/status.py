"""The JobDB's state for ``exactly status``: per destination, its jobs by state."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from exactly.delivery.jobdb.base import Summary
from exactly.delivery.settings import DestinationSettings
from exactly.urls import embedded_path


def read(url: str, destinations: Sequence[DestinationSettings]) -> list[Summary] | None:
    """Per destination (each configured one too), its jobs in the JobDB at ``url`` by state;
    None when an embedded JobDB is not there (looking creates nothing)."""
    path = embedded_path(url) if url.startswith("sqlite://") else None
    if path is not None and not path.exists():
        return None
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.faces import JobReader

    jobdb: JobReader
    with open_jobdb(url) as jobdb:
        found = jobdb.summary(time.time())
    for destination in destinations:
        found.setdefault(destination.name, Summary(destination.name, {}))
    return [entry for _, entry in sorted(found.items())]


def render(destinations: list[Summary], url: str, data_dir: Path) -> str:
    """The section for people, within 80 columns."""
    from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED
    from exactly.text import count, fit, place, wrap
    from exactly.units import format_duration

    lines = [fit("delivery", place(url, data_dir))]
    for entry in destinations:
        states, age = entry.states, entry.oldest_pending_seconds
        lines.append(
            wrap(
                f"  {entry.destination}: queued {count(entry.queued)}, retrying "
                f"{count(states.get(AWAITING_RETRY, 0))}, succeeded "
                f"{count(states.get(SUCCEEDED, 0))}, discarded {count(states.get(DISCARDED, 0))}, "
                f"expired {count(states.get(EXPIRED, 0))}"
                + ("" if age is None else f", oldest queued {format_duration(round(age * 1000))}"),
                "    ",
            )
        )
        said = not_sent(entry)
        if said is not None:
            lines.append(wrap(f"    not sent: {said}", "      "))
        if entry.last_error:
            error = " ".join(entry.last_error.split())[:160]
            lines.append(wrap(f"    last error: {error}", "      "))
    return "\n".join(lines)


def not_sent(entry: Summary) -> str | None:
    """The events routing chose not to send to a destination, by why, in words; None when
    there are none."""
    from exactly.delivery.jobdb.base import FAILED

    withheld = entry.withheld
    parts = [
        (withheld.filtered, "filtered"),
        (withheld.skipped, "skipped"),
        (withheld.dropped, "dropped"),
        (entry.states.get(FAILED, 0), "failed"),
    ]
    said = [f"{count:,} {why}" for count, why in parts if count]
    return ", ".join(said) or None
