"""One Spark task of the dedupe job: a micro-batch's records of a raw partition, as Arrow.

:func:`dedupe_partition` runs in the exactly-once sink's writer, before it writes (with a claim
store; with spark-state in a ``mapInArrow``). The sink then writes its rows to ``events``
partition *p* (DESIGN.md boundary 3). Steps per task (marked in the code):

1. **Lock** the store's partition (held while the task works on it: one writer per database).
2. **Repair** the store from the output if it is behind it (``recovery.rebuild``).
3. **Resume**: if the output already holds records of this very batch (an earlier attempt died
   after writing some), the records up to the last of them pass exactly when they are in the
   output. So the rows this attempt yields begin with what the sink already stored, in the same
   order, and the sink's resume (by sequence) skips precisely those, whatever the store says now.
4. **Route** records with no usable messageId (no key and a value that is not a JSON object with
   a messageId) to ``<raw>.rejected`` with the reason, appended with producer sequences (the raw
   offsets), so a replay stores each once. Never lost, never a crash. A rejected record whose
   value names a messageId (too long) is keyed by it, so ``exactly trace`` finds it.
5. **Claim** the rest: one store call per Arrow batch, durable before return. A record's key is
   its messageId packed for the plan's scope (``exactly.events.ids``): with ``source`` (the
   default) together with the record's ``sourceId``, read from the value's tail in one vectorised
   pass (the collector's layout) and parsed only when that fails.
6. **Yield** the passing records, values untouched, with the messageId as key and the raw
   offset in header ``exactly.source.offset``. The sink appends them (durable), then Spark
   commits the batch: claim durable, output durable, Spark commit, in that order.

Without a store (the spark-state mode) only step 4 runs and every other record is yielded:
Spark's own operator deduplicates afterwards, on the key, or with scope ``source`` on the packed
``(source, messageId)`` the task adds as column ``id``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain, groupby, pairwise, repeat
from typing import TypeVar, cast

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from exactly.dedupe import recovery
from exactly.dedupe.base import Claim, DedupeStore, StorePartition
from exactly.dedupe.recovery import SOURCE_HEADER
from exactly.errors import InvalidEvent
from exactly.events.ids import DEFAULT_SCOPE, ids_packer, pack_owners, record_sources
from exactly.events.normalise import message_id_of
from exactly.log import Log, Record
from exactly.log.base import DEFAULT_MAX_RECORD_BYTES

REJECTED_HEADER = "exactly.rejected"
PRODUCER = "exactly.dedupe"
MAX_REJECTED_KEY = 4096  # bytes of a too-long messageId kept as the rejected record's key
_T = TypeVar("_T")


@dataclass(frozen=True)
class TaskPlan:
    """What every task needs; pickled to the executors."""

    log_url: str
    source: str
    output: str
    rejected: str
    store: DedupeStore | None  # None: the spark-state mode, Spark's operator decides
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    scope: str = DEFAULT_SCOPE
    forget_key: bytes | None = field(default=None, repr=False)  # None: nobody is suppressed

    @property
    def suppressed(self) -> str:
        return f"{self.source}.suppressed"

    @property
    def adds_id(self) -> bool:
        """Whether the rows carry the packed id as column ``id`` (spark-state, scope source)."""
        return self.store is None and self.scope == "source"


def message_id(key: bytes | None, value: bytes) -> tuple[bytes | None, str | None]:
    """The messageId of a raw record, as UTF-8 (its key, else its JSON's); or why there is none.

    The JSON's is read by :func:`exactly.events.normalise.message_id_of`, the collector's rule.
    """
    if key:
        return key, None
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None, "the value is not JSON"
    if not isinstance(event, dict):
        return None, "the value is not a JSON object"
    try:
        found = message_id_of(event)  # the collector's rule
    except InvalidEvent as error:
        if isinstance(event.get("messageId"), str):
            return None, error.message  # too long
        found = None
    if found is None:
        return None, "no messageId (no key, and no messageId string in the value)"
    return found.encode(), None


def dedupe_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task's passing records (module docstring).

    ``batches`` hold one raw partition, or several one after the other (option ``readTasks``);
    each partition's run is deduped on its own, with its own store partition.
    """
    from exactly.spark.datasource.options import shared_log

    log = shared_log(plan.log_url, plan.max_record_bytes)
    runs = groupby(
        single_partition(batches), key=lambda batch: batch.column("partition")[0].as_py()
    )
    for partition, run in runs:
        yield from _dedupe_run(plan, log, partition, run)


def single_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The non-empty batches cut where the partition changes, so each holds one partition.

    The source reads a task's partitions one after another, but Spark hands the Python worker
    its rows in Arrow batches of its own size: one batch can end one partition's run and begin
    the next one's.
    """
    for batch in batches:
        if not batch.num_rows:
            continue
        column, count = batch.column("partition"), batch.num_rows
        if column[0] == column[count - 1]:
            yield batch  # the usual case: a partition's rows are contiguous
            continue
        changes = pc.indices_nonzero(pc.not_equal(column.slice(1), column.slice(0, count - 1)))
        edges = [0, *(index + 1 for index in changes.to_pylist()), count]
        for low, high in pairwise(edges):
            yield batch.slice(low, high - low)


def _dedupe_run(
    plan: TaskPlan, log: Log, partition: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Steps 1-6 for one raw partition's records of the micro-batch."""
    first = next(batches)
    every = chain([first], batches)
    if plan.store is None:
        for batch in every:
            yield _process(plan, log, batch, None, None, set())
        return
    # 1. lock the store's partition
    with plan.store.open(partition) as part:
        # 2. repair the store from the output
        last = recovery.last_source(log, plan.output, partition)
        recovery.rebuild(part, log, plan.output, plan.store.bounds, last, plan.scope)
        # 3. resume: what an earlier attempt at this batch already wrote
        start = first.column("offset")[0].as_py()
        if last is not None and last < start:
            last = None  # the usual case: nothing of this batch is in the output yet
        done = set() if last is None else recovery.passed_since(log, plan.output, partition, start)
        for batch in every:
            yield _process(plan, log, batch, part, last, done)


def _process(
    plan: TaskPlan,
    log: Log,
    batch: pa.RecordBatch,
    part: StorePartition | None,
    last: int | None,
    done: set[int],
) -> pa.RecordBatch:
    count = batch.num_rows
    offsets: list[int] = batch.column("offset").to_pylist()
    keys: list[bytes | None] = batch.column("key").to_pylist()
    values = batch.column("value")
    partition = batch.column("partition")[0].as_py()
    passes = [True] * count
    rejected: list[tuple[int, str]] = []
    scoped = plan.scope == "source" and (part is not None or plan.adds_id)
    sources = record_sources(values) if scoped else [b""] * count
    claimed: list[int] | range  # the rows to claim, or to give an id column (no store)
    rekeyed = False  # whether a key was taken from a value
    if part is not None and _all_keyed(batch) and (last is None or offsets[0] > last):
        claimed = range(count)  # every record keyed and new to the output: the usual case
    else:
        claimed, rekeyed = _rows_to_claim(
            plan, values, offsets, part, last, done, keys, passes, rejected
        )
    claimed_keys = cast("list[bytes]", keys if len(claimed) == count else _at(keys, claimed))
    if len(claimed) < count:
        sources = _at(sources, claimed)
    packed = ids_packer(plan.scope)(sources, claimed_keys)
    # 4. route what has no messageId
    if rejected:
        _reject(plan, log, batch, partition, rejected)
    # 5. claim: durable when it returns
    if part is not None and claimed:
        times = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000).to_pylist()
        if len(claimed) < count:
            times, offsets = _at(times, claimed), _at(offsets, claimed)
        owners = pack_owners(partition, offsets)
        fields = zip(packed, owners, times, strict=True)
        claims = list(map(tuple.__new__, repeat(Claim), fields))  # without Claim's Python __new__
        for index in part.claim_duplicates(claims):
            passes[claimed[index]] = False
    # 5b. a forgotten person's record (``exactly forget``) does not pass, duplicate or not
    if plan.forget_key is not None:
        _suppress(plan, log, batch, partition, passes, keys)
    # 6. the passing records, keyed and marked with their source offset
    key_column = pa.array(keys, pa.binary()) if rekeyed else batch.column("key")
    kept = pa.array(passes, pa.bool_())
    marked = _with_source(batch.column("headers"), batch.column("offset"))
    columns = [
        batch.column("partition"),
        batch.column("offset"),
        key_column,
        values,
        batch.column("timestamp"),
        marked,
    ]
    schema = batch.schema
    if plan.adds_id:
        ids: list[bytes | None] = [None] * count
        for index, found in zip(claimed, packed, strict=True):
            ids[index] = found
        columns.append(pa.array(ids, pa.binary()))
        schema = schema.append(pa.field("id", pa.binary()))
    return pa.RecordBatch.from_arrays(columns, schema=schema).filter(kept)


def _all_keyed(batch: pa.RecordBatch) -> bool:
    """Whether every record of the batch has a non-empty key (its messageId)."""
    key = batch.column("key")
    return bool(key.null_count == 0 and pc.min(pc.binary_length(key)).as_py() > 0)


def _rows_to_claim(
    plan: TaskPlan,
    values: pa.Array,
    offsets: list[int],
    part: StorePartition | None,
    last: int | None,
    done: set[int],
    keys: list[bytes | None],
    passes: list[bool],
    rejected: list[tuple[int, str]],
) -> tuple[list[int], bool]:
    """Record by record: the rows to claim (or to give an id column), and whether a key was
    taken from a value (into ``keys``).

    A record without a usable messageId is added to ``rejected`` and does not pass; one the
    output already holds from an earlier attempt (step 3) passes as that attempt decided.
    """
    claimed = []
    rekeyed = False
    for index, key in enumerate(keys):
        if not key:
            key, reason = message_id(key, values[index].as_py())
            if key is None:
                rejected.append((index, reason or "rejected"))
                passes[index] = False
                continue
            keys[index] = key
            rekeyed = True
        if part is None:
            if plan.adds_id:
                claimed.append(index)
            continue
        if last is not None and offsets[index] <= last:
            passes[index] = offsets[index] in done  # 3. as the earlier attempt decided
            continue
        claimed.append(index)
    return claimed, rekeyed


def _at(items: list[_T], indices: list[int] | range) -> list[_T]:
    return [items[index] for index in indices]


def _with_source(headers: pa.ListArray, offsets: pa.Array) -> pa.ListArray:
    """Each record's headers plus ``exactly.source.offset``; vectorised when there are none."""
    marks = pc.cast(pc.cast(offsets, pa.string()), pa.binary())
    entry_type = headers.type.value_type
    if len(headers.flatten()) == 0 and headers.null_count == 0:
        names = pa.array([SOURCE_HEADER] * len(offsets), entry_type.field(0).type)
        entries = pa.StructArray.from_arrays(
            [names, marks.cast(entry_type.field(1).type)], fields=list(entry_type)
        )
        positions = pa.array(range(len(offsets) + 1), pa.int32())
        return pa.ListArray.from_arrays(positions, entries, type=headers.type)
    rows = []
    for old, mark in zip(headers.to_pylist(), marks.to_pylist(), strict=True):
        kept = [h for h in old or () if h["key"] != SOURCE_HEADER]
        rows.append([*kept, {"key": SOURCE_HEADER, "value": mark}])
    return pa.array(rows, headers.type)


def _reject(
    plan: TaskPlan, log: Log, batch: pa.RecordBatch, partition: int, rejected: list[tuple[int, str]]
) -> None:
    """Append rejected records to ``<raw>.rejected``; a replayed one is dropped by its sequence."""
    headers = batch.column("headers")
    records = []
    sequences = []
    for index, reason in rejected:
        offset = batch.column("offset")[index].as_py()
        own = tuple((h["key"], h["value"]) for h in headers[index].as_py() or ())
        records.append(
            Record(
                batch.column("value")[index].as_py(),
                batch.column("key")[index].as_py() or _claimed_id(batch.column("value")[index]),
                (*own, (REJECTED_HEADER, reason.encode()), (SOURCE_HEADER, str(offset).encode())),
                batch.column("timestamp")[index].value // 1000,
            )
        )
        sequences.append(offset)
    log.append(plan.rejected, partition, records, producer=PRODUCER, sequences=sequences)


def _suppress(
    plan: TaskPlan,
    log: Log,
    batch: pa.RecordBatch,
    partition: int,
    passes: list[bool],
    keys: list[bytes | None],
) -> None:
    """Drop the passing records of forgotten people, and count each in ``<raw>.suppressed``
    (its messageId and source offset only); a replayed one is dropped by its sequence."""
    from exactly.forget.regulations import suppressing

    assert plan.forget_key is not None
    forgotten = suppressing(log, plan.log_url, plan.forget_key)
    if not forgotten:
        return  # nobody is forgotten: nothing is parsed
    values = batch.column("value")
    offsets = batch.column("offset")
    records, sequences = [], []
    for index in range(batch.num_rows):
        if keys[index] is None or not forgotten.value(values[index].as_py()):
            continue  # (one without a messageId went to the rejects: forget clears them)
        passes[index] = False
        offset = offsets[index].as_py()
        source = ((SOURCE_HEADER, str(offset).encode()),)
        stamp = batch.column("timestamp")[index].value // 1000
        records.append(Record(b"", keys[index], source, stamp))
        sequences.append(offset)
    if records:
        log.append(plan.suppressed, partition, records, producer=PRODUCER, sequences=sequences)


def _claimed_id(value: pa.Scalar) -> bytes | None:
    """The messageId string a rejected record's value names, if any: its key in the rejected
    topic, so that ``exactly trace`` finds it by the log's index by key."""
    try:
        event = orjson.loads(value.as_py())
    except orjson.JSONDecodeError:
        return None
    found = event.get("messageId") if isinstance(event, dict) else None
    return found.encode()[:MAX_REJECTED_KEY] if isinstance(found, str) and found else None
