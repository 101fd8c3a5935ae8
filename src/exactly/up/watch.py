"""Where each stage of the pipeline stands, read from the outside (``exactly up``'s view).

Nothing here asks a running part: a :class:`Snapshot` reads the log's end offsets, the end of the
last micro-batch each query committed (its Spark checkpoint) and the JobDB's counts, all of which
their writers keep durable anyway. Two snapshots give rates; a topic's end minus a query's
position is that query's lag, in records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from exactly.config import Settings
from exactly.delivery.jobdb.base import Summary
from exactly.errors import ExactlyError
from exactly.log import Log
from exactly.spark.checkpoint import committed_end

RAW, EVENTS = "raw", "events"


@dataclass(frozen=True)
class Stage:
    """A streaming query: what it has read (its position) of the topic it reads."""

    name: str
    topic: str
    checkpoint: Path


@dataclass
class Snapshot:
    """The pipeline at one moment: topic ends, query positions, deliveries per destination."""

    at: float
    ends: dict[str, int] = field(default_factory=dict)  # records appended per topic
    positions: dict[str, int] = field(default_factory=dict)  # records read per stage
    deliveries: dict[str, Summary] = field(default_factory=dict)

    def lag(self, stage: Stage) -> int | None:
        if stage.name not in self.positions or stage.topic not in self.ends:
            return None
        return max(0, self.ends[stage.topic] - self.positions[stage.name])


def stages(settings: Settings) -> list[Stage]:
    """The queries ``exactly up`` runs, with their checkpoints (as the pipeline part makes them)."""
    from exactly.aggregate.job import default_checkpoint as aggregate_checkpoint
    from exactly.dedupe.driver import configured_plan
    from exactly.delivery.route import default_checkpoint as route_checkpoint

    found = [
        Stage("dedupe", RAW, configured_plan(settings).checkpoint),
        Stage("aggregate", EVENTS, aggregate_checkpoint(settings.data_dir, EVENTS)),
    ]
    if settings.destinations:
        found.append(Stage("route", EVENTS, route_checkpoint(settings.data_dir, EVENTS).resolve()))
    return found


def take(settings: Settings, log: Log, watched: list[Stage]) -> Snapshot:
    """A snapshot now; a part that has not created its topic or checkpoint yet is left out."""
    snapshot = Snapshot(time.time())
    for topic in (RAW, EVENTS, f"{RAW}.rejected"):
        try:
            snapshot.ends[topic] = sum(log.end_offsets(topic).values())
        except ExactlyError:
            continue
    for stage in watched:
        try:
            end = committed_end(stage.checkpoint)
        except (OSError, ValueError):
            end = None
        if end is not None:
            snapshot.positions[stage.name] = sum(end.values())
    if settings.destinations:
        snapshot.deliveries = _deliveries(settings)
    return snapshot


def _deliveries(settings: Settings) -> dict[str, Summary]:
    from exactly.delivery.jobdb import open_jobdb

    found: dict[str, Summary] = {}
    try:
        with open_jobdb(settings.jobdb_url) as jobdb:
            found = jobdb.summary(time.time())
    except Exception:  # noqa: BLE001 - a view of the JobDB never stops what it watches
        pass
    for destination in settings.destinations:
        found.setdefault(destination.name, Summary(destination.name, {}))
    return found


def rate(before: Snapshot | None, after: Snapshot, count: int | None, was: int | None) -> float:
    """Per second between two snapshots, 0 when either count is unknown."""
    if before is None or count is None or was is None or after.at <= before.at:
        return 0.0
    return max(0.0, (count - was) / (after.at - before.at))
