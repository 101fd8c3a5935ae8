"""The aggregate job: ``events`` into SQL tables of additive counts, exactly once (boundary 5).

A Spark streaming query from the ``exactly`` source with ``foreachBatch``. Per micro-batch:

1. Spark records the batch's offset range in its checkpoint (``offsets/<batch id>``);
2. the batch's events are parsed once and aggregated per table (one row per group; a late event
   lands in the row of the minute it belongs to, which the upsert adds to);
3. the rows and the marker (query id, batch id, the end offsets of step 1) commit in one SQL
   transaction (``AggregateDB.commit``); a marker already there means a replay: nothing changes;
4. Spark commits the batch (``commits/<batch id>``).

A crash anywhere repeats at most the last batch, whose marker stops it at 3. A checkpoint that is
lost (or new, over tables the same checkpoint path filled) starts from the end offsets of the
last batch the database counted, so the database, not the checkpoint, is the source of truth.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.aggregate.base import AggregateDB, Batch
from exactly.aggregate.frame import TIME_FIELDS, aggregate, events_frame, mergeable, source_fields
from exactly.aggregate.settings import RECORDS_PER_TRIGGER
from exactly.aggregate.spec import EVENT_COUNTS, TableSpec
from exactly.errors import AggregateError
from exactly.log import Log
from exactly.spark import checkpoint as spark_checkpoint
from exactly.spark.batches import BatchFunction, run_batches
from exactly.spark.datasource import offsets
from exactly.spark.datasource.merging import WEIGHT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class AggregatePlan:
    """Everything one run of the job needs, resolved from settings and flags."""

    log_url: str = field(repr=False)  # may hold secrets: never in a repr
    checkpoint: Path
    tables: tuple[TableSpec, ...] = (EVENT_COUNTS,)
    topic: str = "events"
    until_caught_up: bool = False
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER
    trigger_seconds: float = 1.0
    read_records: int = 10_000
    db_url: str = field(default="", repr=False)  # the aggregate database; may hold secrets
    retry_seconds: float = 600.0  # how long a micro-batch retries an unavailable database


@dataclass
class Progress:
    """Per micro-batch: events counted, and whether it was a replay the marker stopped."""

    batches: dict[int, tuple[int, bool]] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(events for events, counted in self.batches.values() if counted)

    @property
    def replays(self) -> int:
        return sum(1 for _, counted in self.batches.values() if not counted)


def default_checkpoint(data_dir: Path, topic: str) -> Path:
    return data_dir.resolve() / "checkpoints" / f"aggregate-{topic}"


def is_fresh(checkpoint: Path) -> bool:
    """Whether Spark has planned no batch in this checkpoint yet."""
    return not spark_checkpoint.planned(checkpoint)


def starting_offsets(db: AggregateDB, plan: AggregatePlan) -> str:
    """``earliest``, or where the database's counting stopped when the checkpoint is new."""
    if not is_fresh(plan.checkpoint):
        return "earliest"  # Spark resumes from its checkpoint; this is ignored
    marker = db.latest_marker(str(plan.checkpoint), plan.topic)
    if marker is None or marker.end_offsets is None:
        return "earliest"
    return json.dumps(offsets.to_json(marker.end_offsets))


def prepare(log: Log, db: AggregateDB, plan: AggregatePlan, specs: Sequence[TableSpec]) -> str:
    """Check the topic, create or check the tables; returns the starting offsets."""
    log.topic_info(plan.topic)  # a missing topic fails here, in one line
    db.prepare(specs, str(plan.checkpoint), is_fresh(plan.checkpoint))
    return starting_offsets(db, plan)


class BatchCounter(BatchFunction):
    """The ``foreachBatch`` function: steps 2 and 3 of the module docstring."""

    def __init__(
        self,
        db: AggregateDB,
        plan: AggregatePlan,
        specs: Sequence[TableSpec],
        on_batch: Callable[[int, int, bool], None] | None = None,
    ) -> None:
        super().__init__(plan.checkpoint)
        self.db = db
        self.plan = plan
        self.specs = list(specs)
        self.on_batch = on_batch

    def process(self, records: DataFrame, batch_id: int) -> None:
        # 2. parse once, aggregate per table
        frame = events_frame(records, self.specs)
        several = len(self.specs) > 1
        if several:
            frame = frame.persist()
        try:
            rows = {
                spec.name: [tuple(row) for row in aggregate(frame, spec).collect()]
                for spec in self.specs
            }
        finally:
            if several:
                frame.unpersist()
        events = sum(int(row[len(EVENT_COUNTS.keys)]) for row in rows[EVENT_COUNTS.name])
        batch = Batch(
            self.query_id,
            batch_id,
            str(self.plan.checkpoint),
            self.plan.topic,
            spark_checkpoint.batch_end(self.plan.checkpoint, batch_id),
            rows,
            events,
        )
        # 3. upserts and marker in one transaction; a replay stops at the marker
        counted = self.db.commit(batch, self.specs)
        # ``on_batch`` runs after the SQL commit and before Spark's (step 4)
        if self.on_batch is not None:
            self.on_batch(batch_id, events, counted)


def run(
    spark: SparkSession,
    plan: AggregatePlan,
    db: AggregateDB,
    specs: Sequence[TableSpec],
    start: str = "earliest",
    on_batch: Callable[[int, int, bool], None] | None = None,
) -> Progress:
    """Run the query until caught up (``until_caught_up``) or stopped; returns progress.

    ``specs`` are the tables as ``frame.check`` resolved them; the event counts come first. A
    failure raises the :class:`~exactly.errors.ExactlyError` behind it when there is one.
    """
    if not specs or specs[0].name != EVENT_COUNTS.name:
        raise AggregateError("the event counts table comes first")
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # minutes, hours and days in UTC
    progress = Progress()

    def note(batch_id: int, events: int, counted: bool) -> None:
        progress.batches[batch_id] = (events, counted)
        if on_batch is not None:
            on_batch(batch_id, events, counted)

    counter = BatchCounter(db, plan, specs, note)
    columns, options = source_reading(specs)
    run_batches(
        spark,
        "aggregate",
        plan,
        counter,
        columns,
        start=start,
        failed=AggregateError,
        options=options,
    )
    return progress


def source_reading(specs: Sequence[TableSpec]) -> tuple[list[str], dict[str, str]]:
    """The columns the job reads from the source, and the source's options beyond the usual:
    the ``fields`` column and option when the source can read the tables' fields in Arrow
    (``frame.source_fields``), and with them the ``weight`` column and option ``merge`` when
    it may merge alike events (``frame.mergeable``)."""
    columns = ["partition", "offset", "value", "timestamp"]
    fields = source_fields(specs)
    if fields is None:
        return columns, {}
    if not mergeable(specs):
        return [*columns, "fields"], {"fields": fields.option}
    merge = {"fields": fields.option, "merge": ",".join(TIME_FIELDS)}
    return [*columns, "fields", WEIGHT], merge


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def describe(plan: AggregatePlan, db: AggregateDB, start: str) -> str:
    tables = ", ".join(spec.name for spec in plan.tables)
    origin = "" if start == "earliest" else f", from the database's offsets {start}"
    return (
        f"aggregate {plan.topic} -> {db.describe()}: {tables} (checkpoint {plan.checkpoint}"
        f"{origin})"
    )
