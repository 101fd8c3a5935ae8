"""The exactly-once streaming sink: ``df.writeStream.format("exactly")`` (DESIGN.md boundary 4).

Input columns: ``value`` (binary or string, required), ``key`` (binary or string), ``partition``
(int; default: the stable hash of the key, or of the value when there is no key), ``headers``
(array<struct<key: string, value: binary>>) and ``timestamp`` (timestamp; default: now).
``offset`` and ``topic`` are ignored, so the source's rows can be written as they are.

Guarantee: every row of every micro-batch is stored in the topic exactly once, in the order the
task saw it, whatever tasks fail, are retried, linger as zombies, or the query crashes and
replays a batch. The commit protocol, per task and output partition (steps marked in the code):

0. **End what a crashed run left open** (:func:`end_open_writes`, on the driver before the query
   starts again): fence every partition of the topic once. A transaction a killed run left open
   on Kafka hides every later record of its partition from readers until it ends.
1. **Fence.** Open the partition's fenced writer, with the query's sink id as writer id. Every
   earlier writer of this sink on this partition (a failed attempt, a zombie, a crashed run) can
   append nothing from now on (sqlite: epoch checked in the append's transaction; Kafka: the
   transactional id's producer epoch).
2. **Resume.** Read the partition's tail back to this sink's newest mark. The last record of each
   append carries one (sink id, batch id, Spark partition, sequence; ``marks.py``), and an append
   is stored whole or not at all (sqlite; see step 3 for Kafka): if the newest mark is of this
   batch, the records up to its sequence are already stored.
3. **Append** the task's rows for the partition, skipping the stored ones, in appends of
   ``appendRecords``, each one's last record marked (every record on a log that may keep part
   of an append: Kafka on Tansu, which shows aborted transactions).
4. **Commit** the writer (Kafka: the transaction) before the task reports success.
5. **Driver.** Spark calls :meth:`LogStreamWriter.commit` once every task succeeded; it checks
   that no output partition was written by two tasks and records the sink's progress (group
   ``exactly.sink.<sink id>``); then Spark marks the batch done in its checkpoint.

It rests on three assumptions, each checked where it can be:

* **One sink per topic.** The sink holding the topic's lease is recorded in the log
  (``lease.py``); another query's sink is refused with :class:`~exactly.errors.TopicOwned`
  naming the holder's checkpoint.
* **Each output partition's rows in one Spark partition** per micro-batch. True for a query that
  keeps the source's partitions (a copy, a filter, a map); otherwise use
  :func:`cluster_by_partition`. A breach is refused before anything is written (or fenced).
* **A deterministic query**: a replayed micro-batch yields the same rows per output partition in
  the same order. True for the ``exactly`` source (a batch is an offset range) and the queries
  above; after a shuffle (:func:`cluster_by_partition`), option ``order=sorted`` makes the sink
  sort each task's rows by content first.

The sink id is the streaming query's id, which Spark keeps in the checkpoint (option ``sinkId``
overrides it). ``guarantee=at-least-once`` skips steps 1-2 and the marks: plain appends, for
comparison (``bench/spark_io.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from exactly.errors import StreamError
from exactly.events import partition_for
from exactly.gc_pause import collection_paused
from exactly.log import Log, Record
from exactly.log.base import Header, PartitionWriter
from exactly.log.column_reads import HEADERS
from exactly.log.columns import record_columns, with_header, without_header
from exactly.spark.datasource import lease
from exactly.spark.datasource.marks import MARK, Mark, find_mark, resume_at, without_mark
from exactly.spark.datasource.options import AT_LEAST_ONCE, SORTED, SinkOptions, shared_log

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

QUERY_ID = "sql.streaming.queryId"  # local properties Spark sets on every task of a query
BATCH_ID = "streaming.sql.batchId"
PROGRESS_GROUP = "exactly.sink."
_IGNORED = {"offset", "topic"}
_ACCEPTED = ["value", "key", "partition", "headers", "timestamp"]


@dataclass(frozen=True)
class Columns:
    """Which input columns a query gives the sink, checked against their types on the driver."""

    key: bool
    partition: bool
    headers: bool
    timestamp: bool

    @classmethod
    def of(cls, schema: StructType) -> Columns:
        types = {f.name.lower(): f.dataType for f in schema.fields}
        unknown = sorted(set(types) - set(_ACCEPTED) - _IGNORED)
        if unknown or "value" not in types:
            problem = f"unknown column(s) {unknown}" if unknown else "no value column"
            raise StreamError(
                f"the exactly sink got {problem}: it writes columns {_ACCEPTED} "
                "(value required; offset and topic are ignored)"
            )
        text = (BinaryType, StringType)
        header = types.get("headers")
        expected = {
            "value": isinstance(types["value"], text),
            "key": isinstance(types.get("key", BinaryType()), text),
            "partition": isinstance(types.get("partition", IntegerType()), IntegerType | ShortType),
            "timestamp": isinstance(types.get("timestamp", TimestampType()), TimestampType),
            "headers": header is None
            or (
                isinstance(header, ArrayType)
                and isinstance(header.elementType, StructType)
                and [f.name for f in header.elementType.fields] == ["key", "value"]
                and isinstance(header.elementType.fields[1].dataType, text)
            ),
        }
        wrong = [name for name, ok in expected.items() if not ok]
        if wrong:
            raise StreamError(
                f"the exactly sink cannot write column {wrong[0]} of type "
                f"{types[wrong[0]].simpleString()}: value and key are binary or string, partition "
                "int, timestamp timestamp, headers array<struct<key: string, value: binary>>"
            )
        return cls("key" in types, "partition" in types, "headers" in types, "timestamp" in types)


Row = tuple[bytes, bytes | None, tuple[Header, ...], int | None]  # value, key, headers, timestamp
Stage = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def _grouped(batch: pa.RecordBatch, columns: Columns, partitions: int) -> dict[int, list[Row]]:
    """The rows of an Arrow batch per output partition, each partition's in batch order.

    A row is a plain tuple in :class:`~exactly.log.Record` field order (records are built once,
    when the sink knows their mark), built column by column: the dedupe job's batches hold one
    partition's records with one header each, and cost no per-row Python beyond a ``zip``.
    """
    names = {name.lower(): name for name in batch.schema.names}
    count = batch.num_rows
    value_column = batch.column(names["value"])
    if value_column.null_count:
        raise StreamError("the exactly sink got a row whose value is null; values are bytes")
    values = cast("list[bytes]", _bytes(value_column))  # no nulls: checked above
    keys = _bytes(batch.column(names["key"])) if columns.key else [None] * count
    stamps: list[int | None] = [None] * count
    if columns.timestamp:
        micros = batch.column(names["timestamp"]).cast(pa.int64())
        stamps = pc.divide(micros, 1000).to_pylist()
    headers = _headers(batch.column(names["headers"])) if columns.headers else [()] * count
    found: list[Row] = list(zip(values, keys, headers, stamps, strict=True))
    chosen = batch.column(names["partition"]) if columns.partition else None
    if chosen is not None and count and chosen.null_count == 0:
        bounds = pc.min_max(chosen)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low == high:
            return {_checked(low, partitions): found}
    targets = [None] * count if chosen is None else chosen.to_pylist()
    grouped: dict[int, list[Row]] = {}
    for row, target in zip(found, targets, strict=True):
        if target is None:
            partition = partition_for(row[0] if row[1] is None else row[1], partitions)
        else:
            partition = _checked(target, partitions)
        grouped.setdefault(partition, []).append(row)
    return grouped


def _in_columns(
    batch: pa.RecordBatch, columns: Columns, partitions: int
) -> list[tuple[int, pa.RecordBatch]] | None:
    """The batch as record columns (``exactly.log.columns``) per run of one output partition,
    in batch order, marks dropped; None when only :func:`_grouped` can take it (no partition
    column or a null in it, a header with no name).

    The columnar path of the usual batches (a copy, the dedupe job): the sink then appends
    without a Python object per record.
    """
    names = {name.lower(): name for name in batch.schema.names}
    count = batch.num_rows
    chosen = batch.column(names["partition"]) if columns.partition else None
    if chosen is None or chosen.null_count or not count:
        return None
    value = batch.column(names["value"])
    if value.null_count:
        raise StreamError("the exactly sink got a row whose value is null; values are bytes")
    key = (
        batch.column(names["key"]).cast(pa.binary())
        if columns.key
        else pa.nulls(count, pa.binary())
    )
    stamps = pa.nulls(count, pa.int64())
    if columns.timestamp:
        stamps = pc.divide(batch.column(names["timestamp"]).cast(pa.int64()), 1000)
    headers = pa.nulls(count, HEADERS)
    if columns.headers:
        headers = batch.column(names["headers"]).cast(HEADERS)
        entries = headers.flatten()
        if entries.null_count or entries.field("key").null_count:
            return None
        headers = without_header(headers, MARK)
    found = record_columns(value.cast(pa.binary()), key, headers, stamps)
    edges = [0, count]
    bounds = pc.min_max(chosen)
    if bounds["min"] != bounds["max"]:
        changes = pc.indices_nonzero(pc.not_equal(chosen.slice(1), chosen.slice(0, count - 1)))
        edges = [0, *(index + 1 for index in changes.to_pylist()), count]
    return [
        (_checked(chosen[low].as_py(), partitions), found.slice(low, high - low))
        for low, high in pairwise(edges)
    ]


def _checked(partition: int, partitions: int) -> int:
    if not 0 <= partition < partitions:
        raise StreamError(
            f"a row's partition column is {partition}, but the topic has partitions "
            f"0 to {partitions - 1}"
        )
    return partition


def _bytes(column: pa.Array) -> list[bytes | None]:
    """A binary or string column as bytes (None where null)."""
    items: list[bytes | None] = column.to_pylist()
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return items
    return [item.encode() if isinstance(item, str) else item for item in items]


def _headers(column: pa.ListArray) -> list[tuple[Header, ...]]:
    """Each row's headers as ``(name, bytes)`` pairs, less any mark (the sink adds its own)."""
    count = len(column)
    entries = column.flatten()  # minds the slice's offset and null lists
    if not len(entries):
        return [()] * count
    names = entries.field(0).to_pylist()
    pairs = list(zip(names, map(_one_bytes, entries.field(1).to_pylist()), strict=True))
    lengths = pc.fill_null(column.value_lengths(), 0)
    if len(pairs) == count and pc.min(lengths).as_py() == 1 and MARK not in names:
        return [(pair,) for pair in pairs]  # one header each (the dedupe job's output)
    rows: list[tuple[Header, ...]] = []
    at = 0
    for length in lengths.to_pylist():
        rows.append(without_mark(tuple(pairs[at : at + length])) if length else ())
        at += length
    return rows


def _sorted(groups: Iterable[dict[int, list[Row]]]) -> dict[int, list[Row]]:
    """All of a task's rows per output partition, in an order that depends on their content only.

    After a shuffle, the order in which a task receives its rows can differ between attempts;
    sorted, a replayed batch writes the same sequence. Holds the task's rows in memory.
    """
    merged: dict[int, list[Row]] = {}
    for grouped in groups:
        for partition, found in grouped.items():
            merged.setdefault(partition, []).extend(found)
    for found in merged.values():
        found.sort(key=lambda r: (r[1] or b"", r[0], r[3] or 0, r[2]))
    return merged


def _one_bytes(item: bytes | str | None) -> bytes:
    return item.encode() if isinstance(item, str) else item or b""


def last_mark(log: Log, topic: str, partition: int, sink: str, since: int) -> Mark | None:
    """The mark of ``sink``'s newest record in the partition at or after offset ``since``.

    Reads backwards from the end in growing windows and stops at the first marked record: if it
    is another sink's (a former owner of the topic), this sink wrote nothing after it. Unmarked
    records (plain appends) are stepped over.
    """
    high = log.end_offset(topic, partition)
    window = 16
    while high > since:
        low = max(since, high - window)
        batch = [r for chunk in log.read_range(topic, partition, low, high) for r in chunk]
        for record in reversed(batch):
            mark = find_mark(record.headers)
            if mark is not None:
                return mark if mark.sink == sink else None
        high, window = low, window * 8
    return None


def end_open_writes(log: Log, topic: str, sink: str | None) -> int:
    """Step 0: fence every partition of ``topic`` for ``sink`` before its query starts again, so
    that nothing a killed run of it left open waits for the replay; returns the partitions fenced.

    On Kafka, a transaction a killed writer left open hides every record after it from
    ``read_committed`` readers until it ends. Tansu never times one out, so it ends when the
    replay's task for that partition fences it. In one application, the readers of the topic (the
    pipeline's other queries, replaying batches planned up to the end) may hold every task slot
    while they wait, and the replay then waits for their 180 s patience: on two cores the whole
    pipeline stood still for minutes after kills. Fencing here takes one writer start per
    partition (about 30 ms on Tansu). ``sink`` None (a first run: no query id yet) fences nothing.
    """
    if sink is None:
        return 0
    partitions = log.topic_info(topic).partitions
    for partition in range(partitions):
        log.open_writer(topic, partition, sink).close()
    return partitions


class PartitionOutput:
    """One task's rows for one output partition in one micro-batch (steps 1-4 of the protocol)."""

    def __init__(
        self, log: Log, topic: str, partition: int, mark: Mark, since: int, chunk: int
    ) -> None:
        self.partition, self.mark, self.chunk = partition, mark, chunk
        # 1. fence every earlier writer of this sink and partition before reading the tail
        self._writer: PartitionWriter = log.open_writer(topic, partition, mark.sink)
        try:
            # 2. resume: what an earlier attempt at this batch already stored
            last = last_mark(log, topic, partition, mark.sink, since)
            self.skipped = resume_at(last, mark.sink, mark.batch, mark.task, partition)
        except BaseException:
            self._writer.close()
            raise
        self.sequence = 0
        self.appended = 0
        self._pending: list[Row] = []
        self._pending_columns: list[pa.RecordBatch] = []
        self._prefix = mark.encode().rpartition(b" ")[0] + b" "  # all but the sequence
        # a log that may keep part of an append (Kafka on Tansu) needs a mark on every record
        self._mark_every = not self._writer.whole_appends

    def add(self, found: list[Row]) -> None:
        # 3. append the rows not stored yet, marked (_flush)
        if self._pending_columns:
            self._flush()  # in order
        stored = min(max(self.skipped - self.sequence, 0), len(found))
        self._pending += found[stored:] if stored else found
        self.sequence += len(found)
        if len(self._pending) >= self.chunk:
            self._flush()

    def add_columns(self, found: pa.RecordBatch) -> None:
        """:meth:`add` of rows in record columns (:func:`_in_columns`, no marks in them)."""
        if self._pending:
            self._flush()  # in order
        stored = min(max(self.skipped - self.sequence, 0), found.num_rows)
        if stored < found.num_rows:
            self._pending_columns.append(found.slice(stored))
        self.sequence += found.num_rows
        if sum(part.num_rows for part in self._pending_columns) >= self.chunk:
            self._flush()

    def finish(self) -> None:
        self._flush()
        # 4. durable and visible before the task reports success
        self._writer.commit()

    def close(self) -> None:
        self._writer.close()

    def _flush(self) -> None:
        """Append what is pending in appends of ``chunk`` records, marked."""
        pending, self._pending = self._pending, []
        first = self.sequence - len(pending)  # the pending records' sequences follow on
        for at in range(0, len(pending), self.chunk):
            self._writer.append(self._marked(pending[at : at + self.chunk], first + at))
        self.appended += len(pending)
        if self._pending_columns:
            found = pa.concat_batches(self._pending_columns)
            self._pending_columns = []
            first = self.sequence - found.num_rows
            for at in range(0, found.num_rows, self.chunk):
                part = found.slice(at, self.chunk)
                self._writer.append_columns(self._marked_columns(part, first + at))
            self.appended += found.num_rows

    def _marked(self, rows: list[Row], first: int) -> list[Record]:
        """One append's rows, of sequences ``first`` on, as records: the last one marked (an
        append is stored whole), or each one where the log may keep part of an append."""
        prefix, new = self._prefix, tuple.__new__  # skips Record's Python-level __new__
        if self._mark_every:
            return [
                new(Record, (value, key, (*headers, (MARK, prefix + b"%d" % sequence)), stamp))
                for sequence, (value, key, headers, stamp) in enumerate(rows, first)
            ]
        records = [new(Record, row) for row in rows]
        value, key, headers, stamp = rows[-1]
        mark = (MARK, prefix + b"%d" % (first + len(rows) - 1))
        records[-1] = new(Record, (value, key, (*headers, mark), stamp))
        return records

    def _marked_columns(self, part: pa.RecordBatch, first: int) -> pa.RecordBatch:
        """:meth:`_marked` of record columns, the marks added in Arrow."""
        count, headers = part.num_rows, part.column("headers")
        if self._mark_every:
            numbers = pa.array(np.arange(first, first + count)).cast(pa.string())
            prefix = pa.scalar(self._prefix, pa.binary())
            marks = pc.binary_join_element_wise(prefix, numbers.cast(pa.binary()), b"")
            return part.set_column(2, "headers", with_header(headers, MARK, marks))
        mark = pa.array([self._prefix + b"%d" % (first + count - 1)], pa.binary())
        last = with_header(headers.slice(count - 1), MARK, mark)
        marked = pa.concat_arrays([headers.slice(0, count - 1), last])
        return part.set_column(2, "headers", marked)


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: per output partition, records appended and records found stored."""

    sink: str
    batch: int
    task: int
    appended: dict[int, int] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)


class LogStreamWriter(DataSourceStreamArrowWriter):
    """Writes micro-batches to a log topic exactly once (the module docstring has the protocol).

    ``stage``, when given, runs first on the task's Arrow batches, in the same Python worker, and
    the sink writes what it yields (with ``columns`` describing its output): a step of the query
    that saves a trip from the JVM to a Python worker and back (``datasource.register_staged``).
    """

    def __init__(self, options: SinkOptions, columns: Columns, stage: Stage | None = None) -> None:
        self.options = options
        self.columns = columns
        self.stage = stage

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        # A task's rows, records and claims are freed by reference counting: the collector's
        # passes over them found nothing and cost as much as the appends (exactly.gc_pause).
        with collection_paused():
            if self.stage is None:
                return self._write(iterator)
            staged = self.stage(iterator)
            try:
                return self._write(staged)
            finally:  # a failed write ends the stage now, not when the worker collects it (locks)
                close = getattr(staged, "close", None)
                if close is not None:
                    close()

    def _write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = TaskContext.get()
        assert context is not None, "the sink runs in Spark tasks"
        sink = self.options.sink_id or context.getLocalProperty(QUERY_ID)
        batch_id = context.getLocalProperty(BATCH_ID)
        if not sink or batch_id is None:
            raise StreamError("the exactly sink writes streaming queries: use writeStream")
        task = context.partitionId()
        log = shared_log(self.options.log, self.options.max_record_bytes)
        topic = self.options.topic
        partitions = log.topic_info(topic).partitions
        if self.options.guarantee == AT_LEAST_ONCE:
            return self._append_plainly(log, iterator, SinkCommit(sink, int(batch_id), task))
        held = lease.take_once(log, topic, sink, self.options.checkpoint)
        start = Mark(sink, int(batch_id), task, 0)
        groups: Iterator[dict[int, list[Row]] | list[tuple[int, pa.RecordBatch]]]
        if self.options.order == SORTED:
            groups = iter(
                [_sorted(_grouped(batch, self.columns, partitions) for batch in iterator)]
            )
        else:
            groups = (self._parts(batch, partitions) for batch in iterator)
        outputs: dict[int, PartitionOutput] = {}

        def output_of(partition: int) -> PartitionOutput:
            output = outputs.get(partition)
            if output is None:
                since = held.starts.get(partition, 0)
                chunk = self.options.append_records
                output = outputs[partition] = PartitionOutput(
                    log, topic, partition, start, since, chunk
                )
            return output

        try:
            for grouped in groups:
                if isinstance(grouped, dict):
                    for partition, rows in grouped.items():
                        output_of(partition).add(rows)
                    continue
                for partition, found in grouped:
                    output_of(partition).add_columns(found)
            for output in outputs.values():
                output.finish()
        finally:
            for output in outputs.values():
                output.close()
        return SinkCommit(
            sink,
            int(batch_id),
            task,
            {p: output.appended for p, output in outputs.items()},
            {p: output.skipped for p, output in outputs.items()},
        )

    def _parts(
        self, batch: pa.RecordBatch, partitions: int
    ) -> dict[int, list[Row]] | list[tuple[int, pa.RecordBatch]]:
        """The batch per output partition, as record columns when it can be (:func:`_in_columns`),
        else as rows."""
        found = _in_columns(batch, self.columns, partitions)
        return _grouped(batch, self.columns, partitions) if found is None else found

    def _append_plainly(
        self, log: Log, iterator: Iterator[pa.RecordBatch], result: SinkCommit
    ) -> SinkCommit:
        topic, chunk = self.options.topic, self.options.append_records
        partitions = log.topic_info(topic).partitions
        new = tuple.__new__  # a row holds a Record's fields, in order
        for batch in iterator:
            parts = _in_columns(batch, self.columns, partitions)
            for partition, columns in parts or ():
                for at in range(0, columns.num_rows, chunk):
                    log.append_columns(topic, partition, columns.slice(at, chunk))
                result.appended[partition] = result.appended.get(partition, 0) + columns.num_rows
            if parts is not None:
                continue
            for partition, found in _grouped(batch, self.columns, partitions).items():
                for at in range(0, len(found), chunk):
                    records = [new(Record, row) for row in found[at : at + chunk]]
                    log.append(topic, partition, records)
                result.appended[partition] = result.appended.get(partition, 0) + len(found)
        return result

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [message for message in messages if isinstance(message, SinkCommit)]
        writers: dict[int, int] = {}
        for message in done:
            for partition in message.appended:
                if writers.setdefault(partition, message.task) != message.task:
                    raise StreamError(
                        f"output partition {partition} was written by two Spark partitions in "
                        f"batch {batchId}: cluster the DataFrame with "
                        "exactly.spark.datasource.sink.cluster_by_partition"
                    )
        if not done or not writers or self.options.guarantee == AT_LEAST_ONCE:
            return
        # 5. record the sink's progress; Spark marks the batch done after this returns
        log = shared_log(self.options.log, self.options.max_record_bytes)
        ends = log.end_offsets(self.options.topic)
        log.commit_offsets(
            PROGRESS_GROUP + done[0].sink, self.options.topic, {p: ends[p] for p in writers}
        )


def cluster_by_partition(df: DataFrame, partitions: int) -> DataFrame:
    """``df`` ready for the sink when its rows are not already grouped by output partition.

    Adds a ``partition`` column when there is none (the stable hash of the key, else of the
    value) and puts each output partition's rows in one Spark partition. A shuffle delivers rows
    in an order that can change when a batch is replayed, so write the result with
    ``.option("order", "sorted")``: the sink then sorts each task's rows before writing them.
    """
    from pyspark.sql import functions as F

    if "partition" not in df.columns:
        by_hash = F.udf(
            lambda key, value: partition_for(value if key is None else key, partitions), "int"
        )
        key = F.col("key") if "key" in df.columns else F.lit(None).cast("binary")
        df = df.withColumn("partition", by_hash(key, F.col("value")))
    return df.repartition(partitions, "partition")
