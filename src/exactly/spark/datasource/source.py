"""Reading a log topic into Spark: batch reads over offset ranges and a streaming source.

Columns: ``partition`` int, ``offset`` bigint, ``key`` binary, ``value`` binary, ``timestamp``
timestamp, ``headers`` array<struct<key: string, value: binary>> (as Spark's Kafka source);
option ``headers=false`` leaves the last out, for queries that never read it: decoding headers
costs as much as the rest of a read.

Option ``fields`` (top-level fields of JSON values, as ``Fields.option`` writes them: text, times,
and keys of maps of text) adds a column ``fields``: the struct of those fields, read in the
Python worker by Arrow's JSON reader where it reads a value exactly as Spark's ``from_json``
would (``exactly.events.fields``), and null where it cannot be sure; the ``value`` of a record
whose fields were read is null, so that only the others cross to the JVM (with option
``keepValues=true`` every value is kept: a query that needs the value itself, as the route its
payload). Each record has one of
the two, and ``coalesce(fields, from_json(CAST(value AS STRING), <Fields.ddl>))`` is what
``from_json`` alone gives for those fields (of a map, for the keys named), for a fraction of its
CPU (the aggregate job reads events this way). With option ``merge`` as well, records alike
become one row with a ``weight`` column, for a query that only adds up (``merging.py``).

Option ``ranges=true`` reads no record: each task yields its offset ranges, a row ``partition``
int, ``start`` bigint, ``end`` bigint per range, for a query whose next step is Python that reads
the records itself (:func:`read_ranges`, in the same task), so that no record crosses to the JVM
and back (the dedupe job with a claim store: in ``exactly up`` the JVM's CPU per event fell by a
fifth). Spark then counts ranges as its input rows; :func:`records_in` counts a batch's offsets.

Guarantees of the streaming source: a micro-batch is the offset range ``[start, end)`` of every
partition, recorded by Spark in the checkpoint before it runs, and reading a range again yields the
same records in the same order, so a replayed batch is the same batch. Each partition's range is
read by one task, in offset order (the sink relies on this to keep a copy in order). With option
``readTasks`` a task reads several partitions' ranges one after the other, so a micro-batch has at
most that many read tasks (each costs a Python worker's start-up; one per core is cheapest), and
with ``readTaskRecords`` N a batch of fewer than ``readTasks`` times N offsets has one task per N
(a small batch one task: a second would cost more than it saves). The batch's end position
records the grouping, so a replay groups the same way. Offsets are positions, not counts: on
Kafka, transaction markers leave gaps that no record fills.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from exactly.events.fields import Fields
from exactly.events.fields import parse as parse_fields
from exactly.gc_pause import collection_paused
from exactly.log import LogRecord
from exactly.log.column_reads import of_records
from exactly.spark.datasource import merging, offsets
from exactly.spark.datasource.options import SourceOptions, shared_log

END_RECHECKS = 5  # reads of the ends, a second apart, before a partition behind stops a query
SCHEMA_WITHOUT_HEADERS = (
    "partition int, offset bigint, key binary, value binary, timestamp timestamp"
)
SCHEMA = f"{SCHEMA_WITHOUT_HEADERS}, headers array<struct<key: string, value: binary>>"
RANGES_SCHEMA = "partition int, start bigint, end bigint"
_RANGES = pa.schema([("partition", pa.int32()), ("start", pa.int64()), ("end", pa.int64())])
_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.list_(_HEADER)),
    ]
)
ARROW_SCHEMA_WITHOUT_HEADERS = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("headers"))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def schema(headers: bool, fields: Fields | None = None, merge: bool = False) -> str:
    """The source's columns: all of them, or all but ``headers`` (option ``headers=false``), then
    ``fields`` when asked (option ``fields``), then ``weight`` (option ``merge``)."""
    columns = SCHEMA if headers else SCHEMA_WITHOUT_HEADERS
    if fields is not None:
        columns = f"{columns}, fields struct<{fields.ddl}>"
    return f"{columns}, {merging.WEIGHT} bigint" if merge else columns


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One task's work: offsets ``[start, end)`` of one log partition."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class ReadTask(InputPartition):
    """One task's work when partitions are grouped: ranges read one after the other."""

    ranges: tuple[OffsetRange, ...]


def ranges(start: offsets.Offsets, end: offsets.Offsets) -> list[OffsetRange]:
    """The non-empty ranges between two positions, in partition order."""
    return [
        OffsetRange(partition, start.get(partition, 0), stop)
        for partition, stop in sorted(end.items())
        if stop > start.get(partition, 0)
    ]


def tasks_for(found: list[OffsetRange], options: SourceOptions) -> int | None:
    """How many read tasks the ranges ``found`` get: one per ``read_task_records`` offsets, at
    least one and at most ``read_tasks`` (None: one per range)."""
    tasks = options.read_tasks
    if tasks is None:
        return None
    offsets_read = sum(one.end - one.start for one in found)
    return max(1, min(tasks, -(-offsets_read // options.read_task_records)))


def read_tasks(found: list[OffsetRange], tasks: int | None) -> list[InputPartition]:
    """``found`` as at most ``tasks`` tasks of consecutive ranges (None: one task per range).

    Deterministic: the same ranges and count always give the same tasks.
    """
    if tasks is None or tasks >= len(found):
        return list(found)
    size, extra = divmod(len(found), tasks)
    grouped: list[InputPartition] = []
    at = 0
    for task in range(tasks):
        count = size + (1 if task < extra else 0)
        grouped.append(ReadTask(tuple(found[at : at + count])))
        at += count
    return grouped


def read(options: SourceOptions, task: InputPartition) -> Iterator[Any]:
    """The records of one task: its range, or its ranges in turn (option ``ranges``: the
    ranges themselves, one Arrow batch)."""
    if options.ranges:
        found = task.ranges if isinstance(task, ReadTask) else (cast(OffsetRange, task),)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([one.partition for one in found], pa.int32()),
                pa.array([one.start for one in found], pa.int64()),
                pa.array([one.end for one in found], pa.int64()),
            ],
            schema=_RANGES,
        )
        return
    if isinstance(task, ReadTask):
        for one in task.ranges:
            yield from read_range(options, one)
    else:
        assert isinstance(task, OffsetRange)
        yield from read_range(options, task)


def read_range(options: SourceOptions, task: OffsetRange) -> Iterator[Any]:
    """The records of one range, as Arrow record batches or as tuples (``arrow=false``).

    Every record of the range or an error: an empty or short read inside it is read again
    (:meth:`~exactly.log.base.Log.read_range`), never taken for its end.
    """
    log = shared_log(options.log)
    batches = log.read_range_columns(
        options.topic,
        task.partition,
        task.start,
        task.end,
        max_records=min(options.read_records, 100_000),
        headers=options.headers,
    )
    while True:
        with collection_paused():  # a backend reading records frees them by reference counting
            batch = next(batches, None)
        if batch is None:
            return
        if not options.arrow:
            yield from to_rows(batch, task.partition, options.headers)
            continue
        arrow = from_columns(batch, task.partition, options.fields, options.keep_values)
        if options.merge:
            assert options.fields is not None
            yield from merging.merged(arrow, options.fields, options.merge)
        else:
            yield arrow


def read_ranges(options: SourceOptions, rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The records of the ranges in ``rows`` (what option ``ranges`` yields), in order, as Arrow
    record batches of the source's columns: what the source without that option would have
    yielded, read where the ranges arrive. ``options`` are the reading's (``ranges`` unset)."""
    for batch in rows:
        for partition, start, end in zip(
            *(batch.column(name).to_pylist() for name in _RANGES.names), strict=True
        ):
            yield from read_range(options, OffsetRange(partition, start, end))


def records_in(start: dict[str, Any] | None, end: dict[str, Any]) -> int:
    """How many offsets a micro-batch from ``start`` to ``end`` (its source's positions, as in
    its progress report; None: from offset 0) spans: its records on a log
    without gaps (sqlite); on Kafka its transaction markers too."""
    before = {} if start is None else offsets.from_json(start)
    return sum(max(0, stop - before.get(p, 0)) for p, stop in offsets.from_json(end).items())


def to_arrow(
    records: Sequence[LogRecord],
    headers: bool = True,
    fields: Fields | None = None,
    keep_values: bool = False,
) -> pa.RecordBatch:
    """Log records as one Arrow record batch of :data:`ARROW_SCHEMA` (without ``headers``:
    :data:`ARROW_SCHEMA_WITHOUT_HEADERS`), then the ``fields`` column when asked (and the
    values of the records whose fields were read only with ``keep_values``)."""
    partitions = pa.array([record.partition for record in records], pa.int32())
    return from_columns(of_records(records, headers), partitions, fields, keep_values)


def from_columns(
    read: pa.RecordBatch,
    partition: int | pa.Array,
    fields: Fields | None = None,
    keep_values: bool = False,
) -> pa.RecordBatch:
    """What the log answered a columnar read of one partition with (``column_reads.READ``, with or
    without headers) as the source's batch: :func:`to_arrow`'s."""
    if isinstance(partition, int):
        partition = pa.array(np.full(read.num_rows, partition, np.int32))
    value_column = read.column("value")
    found = None if fields is None else parse_fields(value_column, fields)
    if found is not None and not keep_values:  # a value whose fields were read stays here
        value_column = pc.if_else(pc.is_null(found), value_column, pa.scalar(None, pa.binary()))
    columns = [
        partition,
        read.column("offset"),
        read.column("key"),
        value_column,
        pc.multiply(read.column("timestamp"), 1000).cast(pa.timestamp("us", tz="UTC")),
    ]
    schema = ARROW_SCHEMA_WITHOUT_HEADERS
    if "headers" in read.schema.names:
        columns.append(read.column("headers"))
        schema = ARROW_SCHEMA
    if found is not None:
        columns.append(found)
        schema = schema.append(pa.field("fields", found.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def to_rows(
    read: pa.RecordBatch, partition: int, headers: bool = True
) -> Iterator[tuple[Any, ...]]:
    """A columnar read's records as plain tuples, for comparison with Arrow
    (``bench/spark_io.py``)."""
    names = ("offset", "key", "value", "timestamp")
    columns = [read.column(name).to_pylist() for name in names]
    found = read.column("headers").to_pylist() if headers else [None] * read.num_rows
    for offset, key, value, millis, own in zip(*columns, found, strict=True):
        row = (partition, offset, key, value, _EPOCH + timedelta(milliseconds=millis))
        yield (*row, [(h["key"], h["value"]) for h in own]) if own is not None else row


class LogBatchReader(DataSourceReader):
    """``spark.read.format("exactly")``: offsets ``startingOffsets`` to ``endingOffsets``.

    Both default to the whole topic as it is when the read is planned; one task per partition,
    or at most ``readTasks``.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        ends = shared_log(self.options.log).end_offsets(self.options.topic)
        start = offsets.resolve("startingOffsets", self.options.starting, ends)
        end = offsets.resolve("endingOffsets", self.options.ending, ends, offsets.LATEST)
        found = ranges(start, end)
        return read_tasks(found, tasks_for(found, self.options))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read(self.options, partition)


class LogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("exactly")``: the streaming source (module docstring).

    Rate limit: ``maxRecordsPerTrigger`` caps a micro-batch, shared fairly between partitions.
    ``Trigger.AvailableNow`` reads up to the ends found when the query started, then stops.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._target: offsets.Offsets | None = None  # Trigger.AvailableNow's end
        self._latest: offsets.Offsets | None = None

    def initialOffset(self) -> dict[str, int]:
        ends = shared_log(self.options.log).end_offsets(self.options.topic)
        start = offsets.resolve("startingOffsets", self.options.starting, ends)
        return offsets.to_json(start, self.options.read_tasks)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = shared_log(self.options.log).end_offsets(self.options.topic)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        begin = offsets.from_json(start)
        self._latest = self._ends_from(begin)
        end = offsets.limit_to(begin, offsets.advance(begin, self._latest), self._target)
        if isinstance(limit, ReadMaxRows):
            end = offsets.cap(begin, end, limit.max_rows)
        found = ranges(begin, end)
        if not found:  # no batch: the position as Spark has it, or it would see a new one
            return offsets.to_json(end, offsets.tasks_of(start))
        return offsets.to_json(end, tasks_for(found, self.options))

    def _ends_from(self, begin: offsets.Offsets) -> offsets.Offsets:
        """The topic's end offsets, read again for a few seconds while a partition seems to end
        before ``begin``, where this query stopped: a Kafka-protocol broker restarting parts
        under load once answered a partition's end as 0. A topic really deleted and recreated
        still stops the query (:func:`~exactly.spark.datasource.offsets.advance`)."""
        log = shared_log(self.options.log)
        for _ in range(END_RECHECKS):
            ends = log.end_offsets(self.options.topic)
            if all(ends.get(partition, at) >= at for partition, at in begin.items()):
                break
            time.sleep(1.0)
        return ends

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else offsets.to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        found = ranges(offsets.from_json(start), offsets.from_json(end))
        return read_tasks(found, offsets.tasks_of(end))  # as recorded, not as configured now

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read(self.options, partition)
