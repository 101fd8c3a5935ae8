"""The lake query: ``events`` appended to a lake table, each micro-batch exactly once.

A Spark streaming query from the ``exactly`` source with ``foreachBatch``. Per micro-batch:

1. Spark records the batch's offset range in its checkpoint (``offsets/<batch id>``);
2. the driver reads the table's marker for the query: a batch at or below it is a replay,
   and nothing more is done for it;
3. the executors parse the batch's events into the lake's columns (:func:`lake_frame`: the
   same rows as :func:`exactly.lake.columns.event_rows`) and each task writes its rows as
   Parquet files, one per day (:func:`write_files`, :mod:`exactly.lake.files`); the driver
   collects the files' descriptions;
4. the driver commits those files with the marker (query id, batch id) in one table
   transaction (:meth:`~exactly.lake.base.LakeTable.append_files`);
   4b. with ``[lake] layout = "segment"``, the executors shape the batch's events into
   Segment's tables (:mod:`exactly.lake.shaping`) and the driver commits each with the marker
   in its own transaction (:class:`~exactly.lake.warehouse.Warehouse`); a batch whose events
   table has it already (the run was killed between the tables) still reaches the tables that
   have not;
5. Spark commits the batch (``commits/<batch id>``).

A crash anywhere repeats at most the last batch, whose marker stops it at 2 (or inside 4). The
marker carries the batch's end offsets (step 1's): a checkpoint that is new (lost, or a new path
over a filled table) starts where the table's newest batch ended (:func:`starting_offsets`),
so the table, not the checkpoint, is the source of truth.

Every ``compact_every`` commits of a run, the driver compacts the table and expires versions
older than ``retention`` (:meth:`BatchAppender.upkeep`).

As built, the rows never pass through the driver for the lake formats: it holds one line per
file. Files of a failed task attempt, or of a batch killed before step 4, are in no version
(the driver commits only the files it collected) and ``exactly lake vacuum`` removes them.
PostgreSQL has no files, and executors cannot join the driver's SQL transaction: there the rows
come to the driver as Arrow (``DataFrame.toArrow()``) and it ``COPY``s them in step 4
(:meth:`~exactly.lake.base.LakeTable.append`), as much as ``max_records_per_trigger`` allows.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from exactly.errors import LakeConflict, LakeError
from exactly.forget.readers import Following, kept
from exactly.lake.base import DataFile, LakeTable, Marker
from exactly.lake.columns import (
    JSON_COLUMNS,
    PARTITION,
    TEXT_COLUMNS,
    TIME_COLUMNS,
    Promoted,
    lake_schema,
    promoted_columns,
    target_schema,
)
from exactly.lake.files import FileWriter
from exactly.lake.segment import Limits
from exactly.lake.settings import RECORDS_PER_TRIGGER
from exactly.lake.warehouse import Warehouse
from exactly.log import open_log
from exactly.spark import checkpoint as spark_checkpoint
from exactly.spark.batches import BatchFunction, run_batches
from exactly.spark.datasource import offsets
from exactly.units import parse_duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from exactly.config import Settings

EVENT_JSON = ", ".join(
    [f"`{name}` string" for name in TEXT_COLUMNS]
    + [f"`{name}` timestamp" for name in TIME_COLUMNS]
    + [f"`{name}` string" for name in JSON_COLUMNS]  # an object's JSON text
)
SQL_KINDS = {"string": "string", "double": "double", "bigint": "bigint", "boolean": "boolean"}
WRITTEN = "file string"  # write_files's rows: one per file, its DataFile as JSON


@dataclass(frozen=True)
class LakePlan:
    """Everything one run of the lake query needs, resolved from settings and flags."""

    log_url: str = field(repr=False)  # may hold secrets: never in a repr
    table_url: str = field(repr=False)
    checkpoint: Path
    columns: tuple[Promoted, ...] = ()
    topic: str = "events"
    until_caught_up: bool = False
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER
    trigger_seconds: float = 1.0
    read_records: int = 10_000
    compact_every: int = 100  # commits between two upkeeps (optimize, expire); 0: none
    retention: timedelta = timedelta(days=7)
    layout: str = "segment"  # "events": the table alone; "segment": Segment's beside it (4b)
    limits: Limits = field(default_factory=Limits)  # the segment layout's
    shaping: str = "executors"  # where step 4b shapes: "executors", or "driver" (one thread)
    forget_key: bytes | None = field(default=None, repr=False)  # regulations applied when set


@dataclass
class Progress:
    """Per micro-batch: events appended, and whether it was a replay the marker stopped."""

    batches: dict[int, tuple[int, bool]] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(events for events, appended in self.batches.values() if appended)

    @property
    def replays(self) -> int:
        return sum(1 for _, appended in self.batches.values() if not appended)


def default_checkpoint(data_dir: Path, topic: str) -> Path:
    return data_dir.resolve() / "checkpoints" / f"lake-{topic}"


def configured_plan(
    settings: Settings,
    *,
    topic: str = "events",
    checkpoint: Path | None = None,
    until_caught_up: bool = False,
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER,
    trigger_seconds: float = 1.0,
) -> LakePlan:
    """The lake query's plan from ``settings``: what ``exactly lake`` and ``exactly up`` both
    run (the flags that name a setting are in ``settings`` already)."""
    from exactly.forget.regulations import load_key

    return LakePlan(
        log_url=settings.log_url,
        table_url=settings.lake_url,
        checkpoint=(checkpoint or default_checkpoint(settings.data_dir, topic)).resolve(),
        columns=promoted_columns(settings.lake.columns),
        topic=topic,
        until_caught_up=until_caught_up,
        max_records_per_trigger=max_records_per_trigger,
        trigger_seconds=trigger_seconds,
        compact_every=settings.lake.compact_every,
        retention=timedelta(milliseconds=parse_duration(settings.lake.retention, "retention")),
        layout=settings.lake.layout,
        limits=Limits(tables=settings.lake.max_tables, columns=settings.lake.max_columns),
        forget_key=load_key(settings.data_dir),
    )


def lake_frame(records: DataFrame, columns: Sequence[Promoted] = ()) -> DataFrame:
    """Records of the ``events`` topic as the lake's columns (step 3)."""
    from pyspark.sql import functions as F

    event = F.from_json(F.col("value").cast("string"), EVENT_JSON).alias("e")
    parsed = records.select(event)
    promoted = [
        F.expr(
            f"try_cast(get_json_object(e.`{c.source}`, '{c.json_path}') AS "
            f"{SQL_KINDS.get(c.kind, c.kind)})"
        ).alias(c.name)
        for c in columns
    ]
    day = F.to_date(F.coalesce(F.col("e.timestamp"), F.col("e.receivedAt")))
    return parsed.select(
        *[F.col(f"e.`{name}`").alias(name) for name in (*TEXT_COLUMNS, *TIME_COLUMNS)],
        *[F.col(f"e.`{name}`").alias(name) for name in JSON_COLUMNS],
        day.alias(PARTITION),
        *promoted,
    )


def write_files(frame: DataFrame, writer: FileWriter) -> list[DataFile]:
    """Step 3: each task writes its rows of ``frame`` as files (``writer``, pickled to the
    executors); the driver collects one line per file, never the rows."""
    written = frame.mapInArrow(partial(_write_task, writer), WRITTEN).collect()
    return [DataFile(**json.loads(row.file)) for row in written]


def _write_task(writer: FileWriter, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    files = writer.write(batches)
    if files:
        lines = [json.dumps(dataclasses.asdict(file)) for file in files]
        yield pa.RecordBatch.from_pydict({"file": lines})


class BatchAppender(BatchFunction):
    """The ``foreachBatch`` function: steps 2 to 4 of the module docstring."""

    def __init__(
        self,
        table: LakeTable,
        plan: LakePlan,
        on_batch: Callable[[int, int, bool], None] | None = None,
    ) -> None:
        super().__init__(plan.checkpoint)
        self.table = table
        self.plan = plan
        self.on_batch = on_batch
        self.commits = 0  # this run's, for the upkeep every ``compact_every``
        segment = plan.layout == "segment"
        self.warehouse = Warehouse(table, limits=plan.limits) if segment else None
        self.lock = threading.Lock()  # held for a batch; ``exactly forget`` applies between
        self.following = Following(plan.log_url, plan.forget_key)  # whom readers skip

    def process(self, records: DataFrame, batch_id: int) -> None:
        with self.lock:
            self._process(records, batch_id)

    def _process(self, records: DataFrame, batch_id: int) -> None:
        records = kept(records, self.following.forgotten())  # a forgotten person's: never landed
        end = spark_checkpoint.batch_end(self.plan.checkpoint, batch_id)
        marker = Marker(self.query_id, batch_id, end)
        # 2. the marker: a replay stops here (for the events table: Segment's tables have theirs)
        if self.table.replayed(marker):
            if self.warehouse is not None:
                self.land_tables(records, marker)
            self._note(batch_id, 0, False)
            return
        frame = lake_frame(records, self.plan.columns)
        schema = target_schema(lake_schema(self.plan.columns), self.table.schema())
        writer = self.table.file_writer(schema, marker)
        if writer is None:  # 3-4 on the driver (PostgreSQL): the rows as Arrow, then COPY
            rows = frame.toArrow()
            events = rows.num_rows
            appended = events > 0 and self.table.append(rows, marker)
        else:
            # 3. the executors parse and write the files
            files = write_files(frame, writer)
            events = sum(file.records for file in files)
            # 4. files and marker in one table transaction
            appended = events > 0 and self.table.append_files(files, schema, marker)
        if events == 0:
            self._note(batch_id, 0, True)  # nothing to commit, and nothing for a replay to repeat
            return
        if self.warehouse is not None:
            self.land_tables(records, marker)
        self._note(batch_id, events, appended)
        if appended:
            self.commits += 1
            if self.plan.compact_every and self.commits % self.plan.compact_every == 0:
                self.upkeep()

    def land_tables(self, records: DataFrame, marker: Marker) -> None:
        """4b. The segment layout: the batch's events shaped into Segment's tables on the
        executors (:func:`~exactly.lake.shaping.shape_batch`; ``shaping = "driver"``: in the
        driver's thread, :meth:`~exactly.lake.warehouse.Warehouse.shape`, the same rows) and
        committed, each table in its own transaction with ``marker``
        (:class:`~exactly.lake.warehouse.Warehouse`); a table that has the batch already (a
        replay after a kill between two tables) is skipped. Every row of the batch has one
        ``uuid_ts``, the driver's clock when it lands the batch."""
        assert self.warehouse is not None
        loaded_at = datetime.now(UTC)
        if self.plan.shaping == "driver":
            from pyspark.sql import functions as F

            values = records.select(F.col("value").cast("string").alias("v")).toArrow()
            found = [orjson.loads(v) for v in values.column("v").to_pylist() if v]
            if found:
                self.warehouse.write(found, marker, loaded_at=loaded_at)
            return
        from exactly.lake.shaping import shape_batch

        batch = shape_batch(records, self.warehouse, loaded_at=loaded_at)
        if batch.tables:
            self.warehouse.commit(batch, marker)

    def upkeep(self) -> None:
        """Compact the small files the batches added and expire old versions, between two
        batches (their own commits: what a query returns does not change; a kill leaves at
        most unreferenced files, which ``exactly lake vacuum`` removes); Segment's tables too."""
        tables = [self.table]
        if self.warehouse is not None:
            tables += [self.warehouse.table(name) for name in self.warehouse.tables()]
        for table in tables:
            try:
                table.optimize()
                table.expire(self.plan.retention)
            except LakeConflict:
                pass  # another writer (exactly lake optimize) committed first: next time

    def close(self) -> None:
        self.following.close()
        if self.warehouse is not None:
            self.warehouse.close()

    def _note(self, batch_id: int, events: int, appended: bool) -> None:
        # ``on_batch`` runs after the table's commit and before Spark's (step 5)
        if self.on_batch is not None:
            self.on_batch(batch_id, events, appended)


def starting_offsets(table: LakeTable, plan: LakePlan) -> str:
    """``earliest``, or where the table's newest batch ended when the checkpoint is new (lost,
    or a new path over a filled table): the table, not the checkpoint, says what it holds."""
    if spark_checkpoint.planned(plan.checkpoint):
        return "earliest"  # Spark resumes from its checkpoint; this is ignored
    end = table.end_offsets()
    return "earliest" if end is None else json.dumps(offsets.to_json(end))


def run(
    spark: SparkSession,
    plan: LakePlan,
    table: LakeTable,
    on_batch: Callable[[int, int, bool], None] | None = None,
    start: str = "earliest",
) -> Progress:
    """Run the query until caught up (``until_caught_up``) or stopped; returns progress. A
    failure raises the :class:`~exactly.errors.ExactlyError` behind it when there is one."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")  # the date is the UTC day
    progress = Progress()

    def note(batch_id: int, events: int, appended: bool) -> None:
        progress.batches[batch_id] = (events, appended)
        if on_batch is not None:
            on_batch(batch_id, events, appended)

    appender = BatchAppender(table, plan, note)
    follower = None
    if plan.forget_key is not None:  # ``exactly forget`` while the query runs: between batches
        from exactly.forget.follow import Follower
        from exactly.forget.lake import forget_lake

        follower = Follower(
            plan.log_url,
            plan.forget_key,
            "lake",
            lambda forgotten: forget_lake(table, forgotten, set()),
            appender.lock,
        ).start()
    try:
        run_batches(
            spark,
            "lake",
            plan,
            appender,
            ["value"],
            start=start,
            failed=LakeError,
        )
    finally:
        if follower is not None:
            follower.stop()
        appender.close()
    return progress


def say_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def drive(
    spark: SparkSession,
    plan: LakePlan,
    table: LakeTable,
    *,
    say: Callable[[str], None] = say_line,
    on_batch: Callable[[int, int, bool], None] | None = None,
) -> Progress:
    """Check the topic, hold the checkpoint's lock, run the query; returns its progress."""
    from exactly.spark.streaming import checkpoint_lock

    with checkpoint_lock(plan.checkpoint, "lake query"):
        with open_log(plan.log_url) as log:
            log.topic_info(plan.topic)  # a missing topic fails here, in one line
        start = starting_offsets(table, plan)
        origin = "" if start == "earliest" else f", from the table's offsets {start}"
        say(f"lake {plan.topic} -> {table.url} (checkpoint {plan.checkpoint}{origin})")
        return run(spark, plan, table, on_batch, start)
