"""The partitioned, append-only, durable log every stage of `exactly` reads and writes.

A log holds topics; a topic holds ``partitions`` numbered from 0; a partition is a sequence of
records numbered by offset from 0, in the order they were appended. Every backend keeps this
contract:

* **Durable on return.** When :meth:`Log.append` returns, its records survive a crash of the
  appending process and of the machine (fsync, or acks from all in-sync replicas).
* **Offsets are dense and stable.** The records of one append get consecutive offsets, in order.
  One exception: on Kafka, each commit of a fenced writer (a transaction) ends with a marker that
  takes an offset no record has, so readers must step over gaps, never count offsets.
* **Producer idempotency** (Pulsar's design, DESIGN.md boundary 2). An append may carry a producer
  name and one sequence id per record. A record whose sequence id is not above the last one stored
  for that producer on that partition is dropped and reported as a duplicate, and
  :meth:`Log.last_sequence` survives restarts, so a producer that crashed can resume where its
  durable appends ended. One producer name has one writer at a time per partition.
* **Fenced writers** (DESIGN.md boundary 4). :meth:`Log.open_writer` returns a writer of one
  partition that fences every writer opened before it with the same (topic, partition, writer id):
  from then on their appends fail with :class:`~exactly.errors.Fenced`, so a stale task (a zombie)
  cannot add to a partition after its successor read the partition's tail to resume.

Backends implement the ``_``-prefixed methods; validation lives here once, so every backend rejects
the same bad input with the same error.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from exactly.errors import (
    Fenced,
    InvalidRecord,
    InvalidTopicName,
    LogError,
    PartitionOutOfRange,
    RecordTooLarge,
    ShortRead,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

Header = tuple[str, bytes]

DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
RESERVED_HEADERS = frozenset({"exactly.producer", "exactly.seq"})  # producer sequences on Kafka
MAX_PARTITIONS = 4096
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")  # fullmatch: "$" passes "raw\n"


class Record(NamedTuple):
    """A record to append. ``timestamp`` is milliseconds since the epoch; None means now.

    A named tuple rather than a frozen dataclass: the sink and the collector build hundreds of
    thousands per second, and a named tuple is built in a quarter of the time.
    """

    value: bytes
    key: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None

    @property
    def size(self) -> int:
        """Bytes counted against the record size limit: key, value and headers."""
        return (
            len(self.value)
            + (len(self.key) if self.key is not None else 0)
            + sum(len(name) + len(value) for name, value in self.headers)
        )


class LogRecord(NamedTuple):
    """A record as stored: where it is (partition, offset) and what it holds.

    A named tuple rather than a dataclass: reads build hundreds of thousands per second.
    """

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[Header, ...]
    timestamp: int


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append did: one entry per input record, its offset or None if it was a duplicate."""

    offsets: list[int | None] = field(default_factory=list)

    @property
    def appended(self) -> int:
        return sum(1 for offset in self.offsets if offset is not None)

    @property
    def duplicates(self) -> int:
        return sum(1 for offset in self.offsets if offset is None)


def accept_sequences(last: int | None, sequences: Sequence[int]) -> tuple[list[bool], int | None]:
    """Which records of an append pass the producer-sequence check, and the new last sequence.

    A record passes when its sequence id is above every sequence id stored before it, including
    earlier records of the same append. Pure, so both backends decide identically.
    """
    accepted: list[bool] = []
    for sequence in sequences:
        fresh = last is None or sequence > last
        accepted.append(fresh)
        if fresh:
            last = sequence
    return accepted, last


class PartitionWriter(ABC):
    """A fenced writer of one partition, from :meth:`Log.open_writer`.

    Guarantee: once :meth:`commit` returns, every record appended since the previous commit is
    durable and visible to readers, in append order, after the records that were in the partition
    when this writer opened; and none of them is stored once a newer writer with the same
    (topic, partition, writer id) has opened: the append or commit that would store it raises
    :class:`~exactly.errors.Fenced` instead. Before :meth:`commit`, backends differ: sqlite stores
    each append when it returns, Kafka at commit (one transaction per commit). A writer that dies
    may therefore leave a prefix of its appends, and its successor reads the tail to learn which.
    One thread uses a writer at a time.
    """

    topic: str
    partition: int
    writer_id: str
    whole_appends: bool = False
    """Whether a writer that dies leaves whole appends only, each stored entirely or not at all
    (sqlite). False where readers may see part of one (Kafka on Tansu, which does not hide an
    aborted transaction): the exactly-once sink then marks every record, not each append's last."""

    @abstractmethod
    def append(self, records: Sequence[Record]) -> None:
        """Append ``records`` (validated like :meth:`Log.append`) after the previous ones."""

    def append_columns(self, columns: pa.RecordBatch) -> None:
        """:meth:`append` of records in Arrow columns (``exactly.log.columns``).

        By default as :class:`Record` objects; a backend that can pack columns overrides this.
        """
        self.append(records_of(columns))

    @abstractmethod
    def commit(self) -> None:
        """Make every record appended so far durable and visible; raises Fenced if superseded."""

    @abstractmethod
    def close(self) -> None:
        """Release the writer; records appended since the last commit may be dropped."""

    def __enter__(self) -> PartitionWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def records_of(columns: pa.RecordBatch) -> list[Record]:
    """Records in Arrow columns (``exactly.log.columns``) as :class:`Record` objects, in order."""
    values = columns.column("value").to_pylist()
    keys = columns.column("key").to_pylist()
    stamps = columns.column("timestamp").to_pylist()
    headers = [
        tuple((entry["key"], entry["value"] or b"") for entry in found) if found else ()
        for found in columns.column("headers").to_pylist()
    ]
    new = tuple.__new__  # skips Record's Python-level __new__
    return [new(Record, row) for row in zip(values, keys, headers, stamps, strict=True)]


def fenced(topic: str, partition: int, writer_id: str) -> Fenced:
    """The error every backend raises for an append by a superseded writer."""
    return Fenced(
        f"writer {writer_id!r} of {topic!r} partition {partition} was fenced: a newer writer with "
        "the same id opened since (a retried or restarted task); this one must stop"
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Log(ABC):
    """A partitioned, append-only, durable log (see the module docstring for the contract)."""

    url: str  # for people: secrets masked (exactly.urls.redact); reopen from the configured URL
    read_patience = 30.0  # seconds a range read may get nowhere before it fails (read_range)

    def __init__(self, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
        self.max_record_bytes = max_record_bytes

    # -- topics ---------------------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int, *, exist_ok: bool = False) -> TopicInfo:
        """Create ``topic`` with ``partitions`` partitions.

        With ``exist_ok``, an existing topic with the same partition count is returned as is; a
        different count raises :class:`~exactly.errors.TopicExists` either way.
        """
        check_topic_name(topic)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidRecord(f"a topic needs 1 to {MAX_PARTITIONS} partitions, not {partitions}")
        return self._create_topic(topic, partitions, exist_ok=exist_ok)

    def topic_info(self, topic: str) -> TopicInfo:
        """The topic's name and partition count; :class:`~exactly.errors.UnknownTopic` if absent."""
        check_topic_name(topic)
        return self._topic_info(topic)

    def topics(self) -> list[str]:
        """Names of every topic, sorted."""
        return sorted(self._topics())

    # -- records --------------------------------------------------------------------------------

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        *,
        producer: str | None = None,
        sequences: Sequence[int] | None = None,
    ) -> AppendResult:
        """Append ``records`` to one partition; durable when this returns.

        With ``producer`` and ``sequences`` (one non-negative id per record), records whose
        sequence id is not above the last stored for (producer, partition) are dropped and
        reported as None in the result's offsets.
        """
        self._check_partition(topic, partition)
        self._check_records(records)
        if (producer is None) != (sequences is None):
            raise InvalidRecord(
                "an append carries both a producer name and sequence ids, or neither"
            )
        if producer is not None and sequences is not None:
            if not producer or len(producer) > 200:
                raise InvalidRecord("a producer name is 1 to 200 characters")
            if len(sequences) != len(records):
                raise InvalidRecord(
                    f"{len(records)} records need {len(records)} sequence ids, got {len(sequences)}"
                )
            if any(not isinstance(s, int) or s < 0 for s in sequences):
                raise InvalidRecord("sequence ids are non-negative integers")
        if not records:
            return AppendResult([])
        return self._append(topic, partition, records, producer, sequences)

    def append_columns(self, topic: str, partition: int, columns: pa.RecordBatch) -> AppendResult:
        """:meth:`append` of records in Arrow columns (``exactly.log.columns``), without producer
        sequences; durable when this returns.

        By default as :class:`Record` objects; a backend that can pack columns overrides this.
        """
        return self.append(topic, partition, records_of(columns))

    def append_many(
        self, topic: str, batches: Mapping[int, Sequence[Record]]
    ) -> dict[int, AppendResult]:
        """Append to several partitions at once; all durable when this returns.

        The collector's path: one request's events span partitions. Each partition's records are
        appended in order, as by :meth:`append`; a backend may commit them together (sqlite: one
        transaction, one fsync), but no atomicity across partitions is promised.
        """
        for partition, records in batches.items():
            self._check_partition(topic, partition)
            self._check_records(records)
        wanted = {p: list(records) for p, records in batches.items() if records}
        results = self._append_many(topic, wanted) if wanted else {}
        return {p: results.get(p, AppendResult([])) for p in batches}

    def _append_many(self, topic: str, batches: dict[int, list[Record]]) -> dict[int, AppendResult]:
        """Default: one append per partition; backends that can group them override this."""
        return {p: self._append(topic, p, records, None, None) for p, records in batches.items()}

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        headers: bool = True,
    ) -> list[LogRecord]:
        """Records of one partition from ``offset`` on, in order, at most ``max_records``.

        Stops after the record that makes the batch reach ``max_bytes`` (so one large record is
        still returned). Empty when ``offset`` is at or past the end, but not only then: on Kafka
        a fetch can come back short, even empty, inside the partition, so a reader of a range
        uses :meth:`read_range`, which reads it to its end. With ``headers=False``
        every record's headers come back empty, for readers that never look at them: they are
        then not decoded, which costs as much as the rest of a read.
        """
        self._check_partition(topic, partition)
        if offset < 0:
            raise InvalidRecord(f"offsets start at 0, not {offset}")
        if max_records < 1 or max_bytes < 1:
            raise InvalidRecord("max_records and max_bytes must be positive")
        return self._read(topic, partition, offset, max_records, max_bytes, headers)

    def read_range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        headers: bool = True,
        patience: float | None = None,
    ) -> Iterator[list[LogRecord]]:
        """Every record of offsets ``[start, end)`` of one partition, in order, batch by batch.

        ``end`` is an end this log reported (:meth:`end_offsets`; None: the end now), so every
        offset below it holds a record, or on Kafka a transaction marker or an aborted record.
        A read that comes back empty or short is not the end of the range: on Kafka a fetch can
        stop inside committed records (Tansu answered 1 record where 23 were, then 22 on the
        next read). The range goes on from the position the read reached (past markers), and a
        read that gets nowhere is retried with backoff; one that gets nowhere for ``patience``
        seconds (default: :attr:`read_patience`) raises :class:`~exactly.errors.ShortRead`, so
        that a reader fails rather than finish a range short.
        """
        end, wait, where = self._range(
            topic, partition, start, end, max_records, max_bytes, patience
        )

        def read_at(offset: int, retry: bool) -> tuple[list[LogRecord], int]:
            return self._read_at(
                topic, partition, offset, max_records, max_bytes, headers, retry=retry
            )

        return read_through(read_at, start, end, wait, where)

    def _range(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None,
        max_records: int,
        max_bytes: int,
        patience: float | None,
    ) -> tuple[int, float, str]:
        """A range read's arguments checked: its end, its patience and what it reads, named."""
        self._check_partition(topic, partition)
        if end is None:
            end = self._end_offset(topic, partition)
        if start < 0 or max_records < 1 or max_bytes < 1:
            raise InvalidRecord("offsets start at 0; max_records and max_bytes must be positive")
        wait = self.read_patience if patience is None else patience
        return end, wait, f"{topic!r} partition {partition}"

    def read_range_columns(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int | None = None,
        *,
        max_records: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        headers: bool = True,
        patience: float | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """:meth:`read_range`'s records as Arrow record batches of ``exactly.log.column_reads.READ``
        (without ``headers``: ``READ_WITHOUT_HEADERS``), for readers that want columns: the
        sqlite log cuts them out of its stored batches without a Python object per record."""
        end, wait, where = self._range(
            topic, partition, start, end, max_records, max_bytes, patience
        )

        def read_at(offset: int, retry: bool) -> tuple[pa.RecordBatch | None, int]:
            return self._read_columns_at(
                topic, partition, offset, max_records, max_bytes, headers, retry=retry
            )

        return read_through(read_at, start, end, wait, where, cut=_columns_below)

    def _read_at(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool,
        *,
        retry: bool = False,
    ) -> tuple[list[LogRecord], int]:
        """Records from ``offset`` on and the position reached: the offset the next read starts
        at. Offsets are dense here; a backend with gaps (Kafka) reports its reader's position.
        ``retry``: the last read from ``offset`` got nowhere, so read afresh."""
        records = self._read(topic, partition, offset, max_records, max_bytes, headers)
        return records, records[-1].offset + 1 if records else offset

    def _read_columns_at(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool,
        *,
        retry: bool = False,
    ) -> tuple[pa.RecordBatch | None, int]:
        """:meth:`_read_at` as columns (None: no record); a backend may read them as such."""
        from exactly.log.column_reads import of_records

        records, reached = self._read_at(
            topic, partition, offset, max_records, max_bytes, headers, retry=retry
        )
        return (of_records(records, headers) if records else None), reached

    def end_offsets(self, topic: str) -> dict[int, int]:
        """For each partition, the offset the next appended record will get."""
        self.topic_info(topic)
        return self._end_offsets(topic)

    def settle(self, topic: str) -> None:
        """Make readable every record of ``topic`` already stored, acknowledged or not: those of
        a writer killed after storing them and before its acknowledgement. Call it before a read
        that decides whether to write something again (``exactly forget`` rerun after a kill),
        so the read sees what the killed try stored. A log whose reads see every stored record
        needs nothing here (Kafka: a record is readable once stored)."""
        self.topic_info(topic)
        self._settle(topic)

    def _settle(self, topic: str) -> None:  # noqa: B027 - most backends need nothing here
        """Default: every stored record is readable already."""

    def start_offsets(self, topic: str) -> dict[int, int]:
        """For each partition, the offset of its oldest record still held: 0 unless retention
        (a Kafka topic's ``retention.ms``) removed older ones."""
        info = self.topic_info(topic)
        return self._start_offsets(topic, info.partitions)

    def _start_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        """Default: a log that never removes records starts every partition at 0."""
        return dict.fromkeys(range(partitions), 0)

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next record appended to ``partition`` will get."""
        self._check_partition(topic, partition)
        return self._end_offset(topic, partition)

    def _end_offset(self, topic: str, partition: int) -> int:
        """From :meth:`_end_offsets`; a backend that can ask about one partition overrides this."""
        return self._end_offsets(topic)[partition]

    def rewrite(
        self,
        topic: str,
        change: Callable[[LogRecord], bytes | None],
        hint: Callable[[bytes], bool] | None = None,
    ) -> int:
        """Replace in place the value of every record ``change`` gives a new value for (its
        offset, key, headers and timestamp kept), leaving no copy of the old one in the log's
        files; how many changed. ``hint``, given a stored batch's bytes, says whether it may
        hold one (a fast byte search), so the others are not decoded. For ``exactly forget``;
        a log that cannot rewrite a record (Kafka) raises :class:`~exactly.errors.LogError`."""
        raise LogError(f"{self!r} cannot rewrite a record in place")

    def find(self, topic: str, partition: int, key: bytes) -> list[LogRecord] | None:
        """The records of ``partition`` whose key is ``key``, by offset, durable ones only; None
        when this backend keeps no index by key (a lookup would be a scan: ``exactly trace``)."""
        self._check_partition(topic, partition)
        return self._find(topic, partition, key)

    def _find(self, topic: str, partition: int, key: bytes) -> list[LogRecord] | None:
        """No index by key unless a backend keeps one (the sqlite log does)."""
        return None

    def open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter:
        """Open a fenced writer of one partition (see :class:`PartitionWriter`).

        Opening fences every writer opened earlier, in any process, with the same ``topic``,
        ``partition`` and ``writer_id``; writers with other ids, plain appends and other
        partitions are not affected.
        """
        self._check_partition(topic, partition)
        if not isinstance(writer_id, str) or not 1 <= len(writer_id) <= 200:
            raise InvalidRecord("a writer id is 1 to 200 characters")
        return self._open_writer(topic, partition, writer_id)

    # -- consumer groups ------------------------------------------------------------------------

    def commit_offsets(self, group: str, topic: str, offsets: Mapping[int, int]) -> None:
        """Store, durably, the next offset ``group`` will read in each given partition."""
        check_group_name(group)
        for partition, offset in offsets.items():
            self._check_partition(topic, partition)
            if offset < 0:
                raise InvalidRecord(f"offsets start at 0, not {offset}")
        if offsets:
            self._commit_offsets(group, topic, dict(offsets))

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        """The offsets ``group`` committed for ``topic``; partitions never committed are absent."""
        check_group_name(group)
        self.topic_info(topic)
        return self._committed_offsets(group, topic)

    # -- producer idempotency -------------------------------------------------------------------

    def last_sequence(self, topic: str, partition: int, producer: str) -> int | None:
        """The highest sequence id stored for ``producer`` on this partition, None if none."""
        self._check_partition(topic, partition)
        return self._last_sequence(topic, partition, producer)

    # -- life cycle -----------------------------------------------------------------------------

    def close(self) -> None:  # noqa: B027 - backends without resources need nothing here
        """Release connections and threads; the log object is unusable afterwards."""

    def __enter__(self) -> Log:
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self, 'url', '?')!r})"

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared validation ----------------------------------------------------------------------

    def _check_partition(self, topic: str, partition: int) -> None:
        info = self.topic_info(topic)
        if not isinstance(partition, int) or not 0 <= partition < info.partitions:
            raise PartitionOutOfRange(
                f"topic {topic!r} has partitions 0 to {info.partitions - 1}; "
                f"there is no partition {partition}"
            )

    def _check_records(self, records: Iterable[Record]) -> None:
        limit = self.max_record_bytes
        for index, (value, key, headers, _) in enumerate(records):
            if not isinstance(value, bytes):
                raise InvalidRecord(f"record {index}: the value must be bytes")
            if key is not None and not isinstance(key, bytes):
                raise InvalidRecord(f"record {index}: the key must be bytes or None")
            size = len(value) + (len(key) if key is not None else 0)
            if headers:  # a plain loop: the sink marks every record with a header
                for name, data in headers:
                    if name in RESERVED_HEADERS:
                        raise InvalidRecord(
                            f"record {index}: header names {sorted(RESERVED_HEADERS)} are reserved"
                        )
                    size += len(name) + len(data)
            if size > limit:
                raise RecordTooLarge(
                    f"record {index} is {size} bytes; this log accepts at most "
                    f"{self.max_record_bytes} (set log.max_record_bytes to raise the limit)"
                )

    # -- what a backend implements --------------------------------------------------------------

    @abstractmethod
    def _create_topic(self, topic: str, partitions: int, *, exist_ok: bool) -> TopicInfo: ...

    @abstractmethod
    def _topic_info(self, topic: str) -> TopicInfo: ...

    @abstractmethod
    def _topics(self) -> list[str]: ...

    @abstractmethod
    def _append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        producer: str | None,
        sequences: Sequence[int] | None,
    ) -> AppendResult: ...

    @abstractmethod
    def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool = True,
    ) -> list[LogRecord]: ...

    @abstractmethod
    def _end_offsets(self, topic: str) -> dict[int, int]: ...

    @abstractmethod
    def _open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter: ...

    @abstractmethod
    def _commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None: ...

    @abstractmethod
    def _committed_offsets(self, group: str, topic: str) -> dict[int, int]: ...

    @abstractmethod
    def _last_sequence(self, topic: str, partition: int, producer: str) -> int | None: ...


Chunk = TypeVar("Chunk", list[LogRecord], "pa.RecordBatch")  # what read_through yields


def _records_below(records: list[LogRecord], end: int) -> list[LogRecord] | None:
    """``records`` without those at or past ``end``; None when none is."""
    if records[-1].offset < end:
        return None
    return [record for record in records if record.offset < end]


def _columns_below(batch: pa.RecordBatch, end: int) -> pa.RecordBatch | None:
    """The rows of a batch of ``column_reads.READ`` below offset ``end``; None when all are."""
    offsets = batch.column("offset")
    if offsets[len(offsets) - 1].as_py() < end:
        return None
    import numpy as np

    return batch.slice(0, int(np.searchsorted(offsets.to_numpy(), end)))


def read_through(
    read_at: Callable[[int, bool], tuple[Chunk | None, int]],
    start: int,
    end: int,
    patience: float,
    where: str,
    cut: Callable[[Chunk, int], Chunk | None] = _records_below,
) -> Iterator[Chunk]:
    """The records of ``[start, end)`` from ``read_at(offset, retry)``, which answers records
    from ``offset`` on and the position it reached (:meth:`Log.read_range`); as lists of
    records, or as batches of columns (:meth:`Log.read_range_columns`, with ``cut``: the rows
    below an offset, None when all are).

    Goes on from each position reached; a read that gets nowhere is retried with backoff
    (``retry`` true), and one that gets nowhere for ``patience`` seconds raises
    :class:`~exactly.errors.ShortRead`: an empty read before ``end`` is never taken for the end.
    """
    position, stalled, backoff = start, 0.0, 0.0
    while position < end:
        records, reached = read_at(position, stalled > 0)
        if records is not None and len(records):
            below = cut(records, end)
            if below is not None:
                records, reached = below, end
        if records is not None and len(records):
            yield records
        if reached > position:
            position, stalled, backoff = reached, 0.0, 0.0
            continue
        if stalled == 0:
            stalled = time.monotonic()
        elif time.monotonic() - stalled > patience:
            raise ShortRead(
                f"reading {where} stopped at offset {position}, short of {end}, for "
                f"{patience:g} s; check that the log is healthy (exactly doctor)"
            )
        backoff = min(max(backoff * 2, 0.005), 0.5)
        time.sleep(backoff)


def check_topic_name(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
        raise InvalidTopicName(
            f"topic name {topic!r} is not allowed: use 1 to 200 letters, digits, '.', '_' or '-'"
        )


def check_group_name(group: str) -> None:
    if not isinstance(group, str) or not group or len(group) > 200:
        raise InvalidRecord("a consumer group name is 1 to 200 characters")
