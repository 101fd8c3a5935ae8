"""The dedupe job: ``raw`` to ``events`` on Spark, each messageId once per window, exactly once.

A streaming query from the ``exactly`` source to the ``exactly`` sink (DESIGN.md boundaries 3
and 4), partition *p* of ``raw`` to partition *p* of ``events``, values untouched, each output
record carrying its source offset. A duplicate is a record whose messageId was seen before
within the window, from the same source (scope ``source``, the default: one source cannot
suppress another's events) or from any (scope ``workspace``); ``exactly.events.ids`` packs the
key. Two ways to decide what is a duplicate, the plan's :attr:`DedupePlan.mode`:

* **claim**, with a store (``rocksdb``, ``redis``): ``task.py`` runs in the source's own tasks, no
  shuffle, as the stage of the sink's writer (``datasource.register_staged``: one trip from the
  JVM to Python per task, not two). Per task: lock the partition, repair the store from the
  output, resume what an earlier attempt wrote, claim, yield; the sink then appends and Spark
  commits.
* **spark-state**, with no store: Spark's ``dropDuplicatesWithinWatermark`` on the messageId
  (the record key; with scope ``source`` the packed ``(source, messageId)`` the task adds as
  column ``id``) with the watermark on the receive time the log recorded, in the RocksDB
  state store with changelog checkpointing; the window is the watermark delay. The state store
  is versioned per micro-batch, so a replayed batch yields the same rows, which are then
  grouped by output partition and sorted by source offset in each task by the sink's stage
  (streaming queries cannot sort), so the sink sees them in the same order on a replay.
  Records received more than a window behind the newest one seen are *late* to Spark and
  dropped by its operator: the mode's one way to lose a record, counted as ``late`` (keep the
  window well above any backlog).

Both route records without a usable messageId to ``<raw>.rejected``. The scope is recorded with
the store (or the spark-state checkpoint) and checked before Spark starts: ids packed for one
scope are never read with another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from exactly.dedupe import BACKENDS, open_store
from exactly.dedupe.base import DedupeStore, SeenIds
from exactly.dedupe.settings import RECORDS_PER_TRIGGER
from exactly.dedupe.spark_state import NAME as SPARK_STATE
from exactly.dedupe.spark_state import SparkState
from exactly.dedupe.task import TaskPlan, dedupe_partition
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError, StreamError, TopicExists
from exactly.events.ids import DEFAULT_SCOPE, check_scope
from exactly.log import Log
from exactly.spark.session import read_options
from exactly.urls import redact

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

    from exactly.spark.datasource.sink import Stage

Mode = Literal["claim", "spark-state"]
STORES = (*BACKENDS, SPARK_STATE)  # what [dedupe] store may name: a store, or spark-state
SCHEMA = (
    "partition int, offset bigint, key binary, value binary, timestamp timestamp, "
    "headers array<struct<key: string, value: binary>>"
)


@dataclass(frozen=True)
class DedupePlan:
    """Everything one run of the job needs, resolved from settings and flags.

    ``store`` is a store URL (``exactly.dedupe.open_store``) or a name for the default place:
    ``rocksdb`` (under the data dir), ``spark-state`` (the query's checkpoint); see
    :func:`store_url`. It says the job's :attr:`mode`.
    """

    log_url: str
    store: str
    data_dir: Path
    checkpoint: Path
    source: str = "raw"
    output: str = "events"
    bounds: Bounds = field(default_factory=Bounds)
    min_window: int | None = 24 * 3_600_000
    until_caught_up: bool = False
    max_records_per_trigger: int | None = RECORDS_PER_TRIGGER
    trigger_seconds: float = 1.0
    read_records: int = 10_000
    max_record_bytes: int = 1024 * 1024
    scope: str = DEFAULT_SCOPE  # "source": (sourceId, messageId); "workspace": messageId alone
    forget_key: bytes | None = field(default=None, repr=False)  # None: nobody is suppressed

    @property
    def rejected(self) -> str:
        return f"{self.source}.rejected"

    @property
    def suppressed(self) -> str:
        """Where a forgotten person's record is counted: its messageId, no value."""
        return f"{self.source}.suppressed"

    @property
    def window(self) -> int:
        """The spark-state mode's watermark delay (ms); a store's time bound."""
        return self.bounds.window or 24 * 3_600_000

    @property
    def mode(self) -> Mode:
        """``claim``: a store claims each id in the job's tasks; ``spark-state``: Spark's
        ``dropDuplicatesWithinWatermark`` decides, its state in the checkpoint."""
        return "spark-state" if self.store_kind == SPARK_STATE else "claim"

    @property
    def store_kind(self) -> str:
        """The store's backend, or ``spark-state``: one of :data:`STORES`."""
        return store_kind(self.store)

    @property
    def store_url(self) -> str:
        """The store's full URL, its place filled in (it may hold a password: redact to show)."""
        return store_url(self.store, self.data_dir, self.source, self.checkpoint)

    def open_store(self) -> DedupeStore:
        """The plan's claim store, which writes ids packed for the plan's scope."""
        if self.mode != "claim":
            raise ConfigError("the spark-state mode has no claim store: Spark's state decides")
        store = open_store(self.store_url, self.bounds)
        store.scope = self.scope
        return store

    def seen_ids(self) -> SeenIds:
        """Where the job keeps the ids it has seen: its claim store, or Spark's state."""
        if self.mode == "claim":
            return self.open_store()
        state = SparkState.at(self.store_url, self.bounds)
        state.scope = self.scope
        return state


def store_kind(store: str) -> str:
    """``rocksdb``, ``redis`` or ``spark-state`` for a store URL or name; ConfigError otherwise."""
    kind = store.partition(":")[0]
    kind = "redis" if kind == "rediss" else kind
    if kind not in STORES:
        raise ConfigError(
            f"dedupe store {redact(store)!r}: use rocksdb, rocksdb://DIR, "
            "redis://HOST:PORT[,HOST:PORT...][/DB][?namespace=...] or spark-state"
        )
    return kind


def store_url(store: str, data_dir: Path, source: str, checkpoint: Path) -> str:
    """The URL of ``store`` with its default place filled in.

    ``rocksdb`` (or ``rocksdb:``) is ``rocksdb://DATA_DIR/dedupe/SOURCE/rocksdb``; ``spark-state``
    (or ``spark-state:``) is ``spark-state://CHECKPOINT``; a redis URL without a namespace gets
    ``namespace=exactly:dedupe:SOURCE``. Any other URL is returned as given.
    """
    kind = store_kind(store)
    rest = store.partition(":")[2].removeprefix("//")
    if kind == "rocksdb" and rest in ("", "/"):
        return f"rocksdb://{store_root(data_dir, source)}"
    if kind == "spark-state" and rest in ("", "/"):
        return f"spark-state://{checkpoint}"
    if kind == "redis":
        if not rest:
            raise ConfigError(
                "the redis dedupe store needs its servers: redis://HOST:PORT[,HOST:PORT...][/DB]"
            )
        from urllib.parse import parse_qsl, quote

        base, _, query = store.partition("?")
        if "namespace" not in dict(parse_qsl(query)):
            options = f"{query}&" if query else ""
            return f"{base}?{options}namespace={quote(f'exactly:dedupe:{source}', safe=':')}"
    return store


def store_root(data_dir: Path, source: str) -> Path:
    return data_dir.resolve() / "dedupe" / source / "rocksdb"


def default_checkpoint(data_dir: Path, store: str, source: str, output: str) -> Path:
    return data_dir.resolve() / "checkpoints" / f"dedupe-{store}-{source}-{output}"


def prepare(log: Log, plan: DedupePlan) -> int:
    """Check the topics before Spark starts; create ``events`` and the rejects like ``raw``.

    Returns the partition count. Fails with one line if ``raw`` is missing, an output topic
    has another partition count (the job keeps partitions: messageId's partition everywhere), or
    the store (spark-state: the checkpoint) was built with another dedupe scope.
    """
    from exactly.spark import checkpoint
    from exactly.spark.datasource import lease

    check_scope(plan.scope)
    seen = plan.seen_ids()  # a bad store URL fails here, before any topic is touched
    partitions = log.topic_info(plan.source).partitions
    for topic in (plan.output, plan.rejected, plan.suppressed):
        try:
            log.create_topic(topic, partitions, exist_ok=True)
        except TopicExists:
            found = log.topic_info(topic).partitions
            raise StreamError(
                f"dedupe keeps partitions: {topic!r} has {found} partitions, {plan.source!r} "
                f"has {partitions}; use another output topic"
            ) from None
    lease.check(log, plan.output, checkpoint.query_id(plan.checkpoint))
    seen.adopt_scope(plan.scope, partitions)
    return partitions


def build(
    spark: SparkSession, plan: DedupePlan, partitions: int, then: Stage | None = None
) -> tuple[DataFrame, str]:
    """The query's rows and the sink format that writes them to ``events``.

    The sink is the ``exactly`` sink with the job's last Python step as its stage (registered
    as ``exactly-dedupe-OUTPUT``, ``datasource.register_staged``). With a claim store no record
    crosses to the JVM: the source yields each task's offset ranges of ``raw`` (option
    ``ranges``), and the stage, in the same task, reads their records and claims them. With
    spark-state, the rows are ``raw``'s (Spark's operator needs them) and the stage puts each
    task's rows in source order. ``then`` runs on the task's Arrow batches after the stage (tests
    inject failures there).
    """
    from exactly.spark.datasource import register_staged
    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.sink import Columns
    from exactly.spark.datasource.source import read_ranges

    reader = (
        spark.readStream.format("exactly")
        .option("log", plan.log_url)
        .option("topic", plan.source)
        .option("readRecords", str(plan.read_records))
        .options(**read_options(spark))
        .option("ranges", str(plan.mode == "claim").lower())
    )
    if plan.max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(plan.max_records_per_trigger))
    raw = reader.load()
    task = TaskPlan(
        plan.log_url,
        plan.source,
        plan.output,
        plan.rejected,
        plan.open_store() if plan.mode == "claim" else None,
        plan.max_record_bytes,
        plan.scope,
        plan.forget_key,
    )
    stage: Stage = partial(dedupe_partition, task)
    if plan.mode == "claim":
        reading = SourceOptions(plan.log_url, plan.source, read_records=plan.read_records)
        stage = partial(_in_turn, partial(read_ranges, reading), stage)
    rows = raw
    if plan.mode == "spark-state":
        routed = raw.mapInArrow(stage, SCHEMA + ", id binary" if task.adds_id else SCHEMA)
        key = "id" if task.adds_id else "key"  # workspace: the key, as checkpoints before scopes
        deduped = (
            routed.withWatermark("timestamp", f"{plan.window} milliseconds")
            .dropDuplicatesWithinWatermark([key])
            .drop("id")
        )
        # Streaming queries cannot sort: the stage sorts each task's rows, the same on a replay.
        rows, stage = deduped.repartition(partitions, "partition"), in_source_order
    if then is not None:
        stage = partial(_in_turn, stage, then)
    name = f"exactly-dedupe-{plan.output}"
    register_staged(
        spark, name, stage, Columns(key=True, partition=True, headers=True, timestamp=True)
    )
    return rows, name


def _in_turn(
    first: Stage, second: Stage, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    return second(first(batches))


def in_source_order(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """All of a task's rows, by output partition and source offset: the same on every replay."""
    import pyarrow as pa

    found = [batch for batch in batches if batch.num_rows]
    if found:
        table = pa.Table.from_batches(found)
        order = [("partition", "ascending"), ("offset", "ascending")]
        yield from table.sort_by(order).to_batches(max_chunksize=10_000)


@dataclass
class Progress:
    """What Spark reported per micro-batch: input rows, output rows, late rows (spark-state)."""

    batches: dict[int, dict[str, Any]] = field(default_factory=dict)

    ranges: bool = False  # the source yielded offset ranges (a claim store): see records_read

    @property
    def records(self) -> int:
        return sum(records_read(b, self.ranges) for b in self.batches.values())


def records_read(report: dict[str, Any], ranges: bool) -> int:
    """The raw records a micro-batch read, from its progress report. With ``ranges`` (a claim
    store: the source's option ``ranges``) Spark's input rows are offset ranges, so the records
    are counted from the batch's offsets (on Kafka, with its transaction markers)."""
    from exactly.spark.datasource.source import records_in

    sources = report.get("sources") or []
    if not ranges or not sources:
        return int(report.get("numInputRows", 0))
    start, end = (_position(sources[0].get(key)) for key in ("startOffset", "endOffset"))
    return 0 if end is None else records_in(start, end)


def _position(found: object) -> dict[str, Any] | None:
    """A source position as a progress report holds it (JSON, or its text)."""
    if isinstance(found, str):
        found = json.loads(found)
    return found if isinstance(found, dict) else None


def run(
    spark: SparkSession,
    plan: DedupePlan,
    partitions: int,
    on_batch: Callable[[dict[str, Any]], None] | None = None,
    then: Stage | None = None,
) -> Progress:
    """Run the query until caught up (``until_caught_up``) or stopped; returns progress.

    Call it with the checkpoint's lock held (:func:`~exactly.spark.streaming.checkpoint_lock`):
    it first ends what a killed run of the query left open in ``events``
    (:func:`~exactly.spark.datasource.sink.end_open_writes`). ``then`` runs on each task's Arrow
    batches on their way to the sink (tests inject failures there). A failure raises the
    :class:`~exactly.errors.ExactlyError` a task raised, when there is one.
    """
    from exactly.log import open_log
    from exactly.spark import checkpoint
    from exactly.spark.datasource.sink import end_open_writes
    from exactly.spark.streaming import run_query

    with open_log(plan.log_url) as log:  # (the checkpoint's lock is held: no run of ours is live)
        end_open_writes(log, plan.output, checkpoint.query_id(plan.checkpoint))
    rows, sink = build(spark, plan, partitions, then)
    writer = (
        rows.writeStream.format(sink)
        .option("log", plan.log_url)
        .option("topic", plan.output)
        .option("checkpointLocation", str(plan.checkpoint))
        .option("maxRecordBytes", str(plan.max_record_bytes))
        .queryName(f"dedupe {plan.source} to {plan.output} ({plan.store_kind})")
    )
    batches = run_query(
        writer,
        until_caught_up=plan.until_caught_up,
        trigger_seconds=plan.trigger_seconds,
        on_batch=on_batch,
    )
    return Progress(batches, ranges=plan.mode == "claim")


def late_rows(report: dict[str, Any]) -> int:
    """Rows Spark's operator dropped as late in one progress report (spark-state)."""
    return sum(
        int(op.get("numRowsDroppedByWatermark", 0)) for op in report.get("stateOperators", [])
    )


def describe(plan: DedupePlan) -> str:
    how = plan.seen_ids().describe()
    scope = "per source" if plan.scope == "source" else "workspace-wide"
    return (
        f"dedupe {plan.source} -> {plan.output} ({scope}) with {how} (checkpoint {plan.checkpoint})"
    )
