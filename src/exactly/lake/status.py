"""The lake table's state for ``exactly status``: its version and how far behind ``events`` it is.

The table says how far it has landed: the end offsets committed with its newest batch
(:meth:`~exactly.lake.base.LakeTable.end_offsets`); the lag is what the topic holds beyond them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.lake.base import LakeTable
from exactly.log import Log

if TYPE_CHECKING:
    from exactly.config import Settings


@dataclass(frozen=True)
class LakeStatus:
    url: str  # secrets masked
    version: int | None  # Delta's version, Iceberg's snapshot id; None: no table yet
    landed: int  # records of the topic the table holds (the sum of its end offsets)
    lag: int | None  # records of the topic not in the table yet; None: unknown topic


def collect(table: LakeTable, log: Log, topic: str = "events") -> LakeStatus:
    from exactly.errors import UnknownTopic

    ends = table.end_offsets() or {}
    landed = sum(ends.values())
    try:
        lag: int | None = sum(
            max(0, end - ends.get(partition, 0))
            for partition, end in log.end_offsets(topic).items()
        )
    except UnknownTopic:
        lag = None
    return LakeStatus(table.url, table.version(), landed, lag)


def read(settings: Settings) -> LakeStatus | None:
    """The lake table's status: with a ``[lake] url``, or once the default table exists."""
    from exactly.lake import open_table
    from exactly.log import open_log

    if not settings.has_lake:
        return None
    with (
        open_table(settings.lake_url) as table,
        open_log(settings.log_url, max_record_bytes=settings.log.max_record_bytes) as log,
    ):
        return collect(table, log)


def render(status: LakeStatus, data_dir: Path) -> str:
    """The section for people, within 80 columns."""
    from exactly.text import count, fit, place, wrap

    version = "no commit yet" if status.version is None else f"version {status.version}"
    behind = "" if status.lag is None else f", lag {count(status.lag)}"
    return "\n".join(
        [
            fit("lake", place(status.url, data_dir)),
            wrap(f"  {version}: {count(status.landed)} records of events{behind}", "    "),
        ]
    )
