"""The lake table's state for ``exactly status``: its version and how far behind ``events`` it is.

The table says how far it has landed: the end offsets committed with its newest batch
(:meth:`~exactly.lake.base.LakeTable.end_offsets`); the lag is what the topic holds beyond them.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly.lake.base import LakeTable
from exactly.log import Log


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
