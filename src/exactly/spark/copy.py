"""A streaming copy of one topic into another through the exactly-once sink (``exactly copy``).

The simplest job on the source and sink, and the one the crash tests drive: partition *p* of the
source goes to partition *p* of the destination, in order, with keys, values, headers and
timestamps, each record exactly once however often the copy is killed and restarted. The source's
partitions become the Spark partitions, so each output partition is written by one task and no
shuffle is needed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.errors import StreamError, TopicExists
from exactly.log import Log
from exactly.spark import checkpoint
from exactly.spark.datasource import lease
from exactly.spark.streaming import Report, run_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from exactly.config import Settings


@dataclass(frozen=True)
class CopyPlan:
    log_url: str = field(repr=False)  # may hold secrets: never in a repr
    source: str
    destination: str
    checkpoint: Path
    until_caught_up: bool = False
    max_records_per_trigger: int | None = None
    trigger_seconds: float = 1.0
    starting_offsets: str = "earliest"
    append_records: int = 5000  # records per append of the sink (option appendRecords)


@dataclass
class CopyProgress:
    """Records read per micro-batch, as Spark reported them."""

    batches: dict[int, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return sum(self.batches.values())


def configured_plan(
    settings: Settings,
    source: str,
    destination: str,
    *,
    checkpoint: Path | None = None,
    until_caught_up: bool = False,
    max_records_per_trigger: int | None = None,
    trigger_seconds: float = 1.0,
    starting_offsets: str = "earliest",
    append_records: int = 5000,
) -> CopyPlan:
    """The copy's plan from ``settings`` and ``exactly copy``'s options: its one builder."""
    from exactly.spark.datasource.offsets import parse_spec

    parse_spec("--starting-offsets", starting_offsets)
    log_url = settings.log_url
    return CopyPlan(
        log_url=log_url,
        source=source,
        destination=destination,
        checkpoint=(
            checkpoint or default_checkpoint(settings.data_dir, log_url, source, destination)
        ).resolve(),
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        starting_offsets=starting_offsets,
        append_records=append_records,
    )


def default_checkpoint(data_dir: Path, log_url: str, source: str, destination: str) -> Path:
    """Where a copy keeps its checkpoint unless told: derived from the command, topics and log."""
    digest = hashlib.sha256(log_url.encode()).hexdigest()[:8]
    return data_dir.resolve() / "checkpoints" / f"copy-{source}-{destination}-{digest}"


def prepare(log: Log, plan: CopyPlan) -> int:
    """Check the topics before Spark starts; create the destination like the source if missing.

    Returns the partition count. Fails fast (one line) when the source is missing, the
    destination has another partition count, or another query's sink owns the destination.
    """
    partitions = log.topic_info(plan.source).partitions
    try:
        log.create_topic(plan.destination, partitions, exist_ok=True)
    except TopicExists:
        found = log.topic_info(plan.destination).partitions
        raise StreamError(
            f"exactly copy keeps partitions: {plan.destination!r} has {found} partitions, "
            f"{plan.source!r} has {partitions}; copy into a new topic"
        ) from None
    lease.check(log, plan.destination, checkpoint.query_id(plan.checkpoint))
    return partitions


def run_copy(
    spark: SparkSession,
    plan: CopyPlan,
    on_batch: Callable[[int, int], None] | None = None,
) -> CopyProgress:
    """Run the copy until it is caught up (``until_caught_up``) or stopped; returns progress.

    ``on_batch(batch_id, records)`` is called for each micro-batch seen. A failure of the query
    raises the :class:`~exactly.errors.ExactlyError` a task raised, when there is one.
    """
    from exactly.log import open_log
    from exactly.spark.datasource.sink import end_open_writes

    with open_log(plan.log_url) as log:  # (the checkpoint's lock is held: no run of ours is live)
        end_open_writes(log, plan.destination, checkpoint.query_id(plan.checkpoint))
    reader = (
        spark.readStream.format("exactly")
        .option("log", plan.log_url)
        .option("topic", plan.source)
        .option("startingOffsets", plan.starting_offsets)
    )
    if plan.max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(plan.max_records_per_trigger))
    writer = (
        reader.load()
        .writeStream.format("exactly")
        .option("log", plan.log_url)
        .option("topic", plan.destination)
        .option("checkpointLocation", str(plan.checkpoint))
        .option("appendRecords", str(plan.append_records))
        .queryName(f"copy {plan.source} to {plan.destination}")
    )
    progress = CopyProgress()

    def note(report: Report) -> None:
        batch, records = int(report["batchId"]), int(report.get("numInputRows", 0))
        progress.batches[batch] = records
        if on_batch is not None:
            on_batch(batch, records)

    run_query(
        writer,
        until_caught_up=plan.until_caught_up,
        trigger_seconds=plan.trigger_seconds,
        on_batch=note,
    )
    return progress
