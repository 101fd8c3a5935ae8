"""The log on any Kafka-protocol cluster (``kafka://HOST:PORT[,HOST:PORT...][?option=value...]``).

Query options go into the librdkafka configuration of every client, e.g. ``?linger.ms=5``. An
option's value may be ``env:NAME`` or ``file:PATH`` (:func:`exactly.urls.resolve`), so that
secrets such as ``sasl.password`` stay out of the URL. :attr:`KafkaLog.url`, and so every message,
shows the URL with secrets masked (:func:`exactly.urls.redact`); the real values live only in the
clients' configuration.

Producer idempotency (DESIGN.md boundary 2) is built from plain produce and fetch: each record of an
append with a producer name carries two headers, ``exactly.producer`` (the name) and ``exactly.seq``
(its sequence id in decimal ASCII). The first time a :class:`KafkaLog` object meets a
(producer, topic, partition) it reads that partition's tail and takes the highest ``exactly.seq``
among the producer's records; afterwards the last sequence lives in memory, updated after every
append, and appends of one (producer, topic, partition) are serialised by a lock. To bound the tail
read, every append commits, best effort, the offset of its first record for the consumer group
``exactly.producer.<name>``; the scan starts there (or at the start of the partition when there is
no hint, or when the record at the hint is not the producer's). The hint only shortens the scan:
correctness comes from the scan itself. Reads strip the two headers, so every backend returns the
same headers.

Why not Kafka transactional ids: they fence a zombie producer, but a restarted producer learns
nothing from them about which of its records were stored, so it still needs a durable sequence
position to resume from. Headers plus a tail read give that position with no broker feature beyond
produce and fetch, so they work on every Kafka-protocol broker, Tansu included.

Fenced writers (:meth:`KafkaLog.open_writer`, DESIGN.md boundary 4) are transactional producers
with ``transactional.id = exactly.<topic>.<partition>.<writer id>``: ``init_transactions`` of a new
writer fences the older producer of that id (its later produce and commit fail with
PRODUCER_FENCED, raised as :class:`~exactly.errors.Fenced`) and ends its open transaction; each
:meth:`~exactly.log.base.PartitionWriter.commit` commits one transaction, whose marker takes one
offset. TANSU QUIRK: Tansu (v0.6) fences correctly but does not hide aborted transactions from
``read_committed`` readers: what a fenced producer produced before it was fenced stays visible.
The sink is exactly-once either way because its successor reads the tail with the same isolation
as every reader: records visible to readers are the records it counts as written.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from exactly.errors import (
    ConfigError,
    InvalidLogURL,
    LogError,
    LogUnavailable,
    RecordTooLarge,
    TopicExists,
    UnknownTopic,
)
from exactly.log.base import (
    DEFAULT_MAX_RECORD_BYTES,
    RESERVED_HEADERS,
    AppendResult,
    Header,
    Log,
    LogRecord,
    PartitionWriter,
    Record,
    TopicInfo,
    accept_sequences,
    fenced,
    now_ms,
    read_through,
)
from exactly.urls import is_secret_option, redact, resolve, scrub

PRODUCER_HEADER = "exactly.producer"
SEQUENCE_HEADER = "exactly.seq"
HINT_GROUP_PREFIX = "exactly.producer."
_RESERVED = RESERVED_HEADERS  # checked for every backend in Log._check_records
_FORCED = {"enable.idempotence": True, "acks": "all"}
_READER = {
    "group.id": "exactly.reader",
    "enable.partition.eof": True,
    # Tansu answers a fetch inside a batch only after this wait, and every read that reaches a
    # partition's end (an end probe, the sink's tail read) ends with one: 10 ms made the sink's
    # tail read 46 ms; 3 ms, 16 ms (1 ms once stalled a writer's start for 0.5 s).
    "fetch.wait.max.ms": 3,
}
_UNKNOWN = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}
_FENCED_CODES = {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}
_NO_LIMIT = 1 << 62
_T = TypeVar("_T")


class _Delivery:
    """Delivery reports of one append: offsets by record index, and an event once all arrived."""

    def __init__(self, count: int) -> None:
        self.offsets = [-1] * count
        self.errors: list[KafkaError] = []
        self.pending = count
        self.done = threading.Event()
        self.lock = threading.Lock()

    def report(self, index: int, error: KafkaError | None, message: Message) -> None:
        with self.lock:
            if error is not None:
                self.errors.append(error)
            else:
                self.offsets[index] = message.offset() or 0
        self.settle(1)

    def settle(self, count: int) -> None:
        with self.lock:
            self.pending -= count
            if self.pending <= 0:
                self.done.set()


class KafkaLog(Log):
    """A log on a Kafka-protocol cluster.

    Guarantee: an append returns only once every record's delivery report from an idempotent
    producer with ``acks=all`` is OK, so its records are as durable as the cluster's in-sync
    replicas make them. The producer sequence check assumes one writer per producer name and
    partition (the contract of :class:`~exactly.log.base.Log`). Within one process the records of
    one append get consecutive offsets and appends from many threads are safe. Any call fails with
    :class:`~exactly.errors.LogUnavailable` after about ``timeout`` seconds without the cluster.
    """

    # a range read waits this long for records below the range's end: a transaction left open
    # by a killed writer hides what follows it until it is aborted, within librdkafka's
    # transaction.timeout.ms (60 s) or when the writer's successor starts
    read_patience = 90.0

    def __init__(
        self,
        bootstrap: str,
        *,
        config: dict[str, str] | None = None,
        timeout: float = 10.0,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        url: str | None = None,
    ) -> None:
        super().__init__(max_record_bytes=max_record_bytes)
        self.url = redact(url or f"kafka://{bootstrap}")
        self.timeout = timeout
        options = dict(config or {})
        self._secrets = [v for k, v in options.items() if is_secret_option(k)]
        for name, value in _FORCED.items():
            if str(options.get(name, value)).lower() != str(value).lower():
                raise InvalidLogURL(f"{self.url}: exactly always sets {name}={value}; remove it")
        # librdkafka logs each disconnect to stderr; callers get exceptions instead.
        # librdkafka waits reconnect.backoff.ms (100) before it connects to a broker it learned
        # from metadata, which is every coordinator: a transactional writer took 53 ms to start
        # instead of 14. Its backoff still doubles on each failure, up to 10 s.
        self._common: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "log_level": 0,
            "reconnect.backoff.ms": 10,
            **options,
        }
        producer = {"linger.ms": 2, "message.timeout.ms": int(timeout * 1000)}
        producer["message.max.bytes"] = max_record_bytes + 64 * 1024
        self._producer_config: dict[str, Any] = {**producer, **self._common, **_FORCED}
        try:
            self._admin = AdminClient(self._common)
            self._producer = Producer(self._producer_config)
            self._reader = self._consumer(_READER)
            self._prober = self._consumer(_READER)
        except KafkaException as error:
            raise InvalidLogURL(
                f"{self.url}: {self._scrub(error.args[0])}; check the options after '?'"
            ) from None
        self._lock = threading.Lock()  # guards the dictionaries below
        self._produce_lock = threading.Lock()
        self._reader_lock = threading.Lock()
        self._prober_lock = threading.Lock()
        self._partitions: dict[str, int] = {}
        self._ends: dict[tuple[str, int], int] = {}
        self._last: dict[tuple[str, str, int], int | None] = {}
        self._sequence_locks: dict[tuple[str, str, int], threading.RLock] = {}
        self._groups: dict[str, Consumer] = {}
        self._position: tuple[str, int, int] | None = None  # what the reader polls next
        self._reader_topics: set[str] = set()  # topics whose metadata the reader has
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_producer, name="kafka-log", daemon=True)
        self._poller.start()

    @classmethod
    def from_url(cls, rest: str, **options: Any) -> KafkaLog:
        shown = redact(f"kafka://{rest}")
        hosts, _, query = rest.partition("?")
        brokers = [host.strip() for host in hosts.rstrip("/").split(",")]
        if any(not b.rpartition(":")[0] or not b.rpartition(":")[2].isdigit() for b in brokers):
            raise InvalidLogURL(f"log URL {shown} is not understood: use kafka://HOST:PORT")
        try:
            given = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
        except ValueError:
            raise InvalidLogURL(f"{shown}: bad options after '?' (write name=value&...)") from None
        try:
            config = {name: resolve(name, value) for name, value in given}
        except ConfigError as error:
            raise InvalidLogURL(f"{shown}: {error}") from None
        return cls(",".join(brokers), config=config, url=shown, **options)

    # -- topics ---------------------------------------------------------------------------------

    def _create_topic(self, topic: str, partitions: int, *, exist_ok: bool) -> TopicInfo:
        futures = self._admin.create_topics(
            [NewTopic(topic, partitions)], request_timeout=self.timeout
        )
        try:
            self._call("create a topic", lambda: futures[topic].result(timeout=self.timeout + 1))
        except LogError as error:
            cause = error.__cause__
            exists = KafkaError.TOPIC_ALREADY_EXISTS
            if not isinstance(cause, KafkaException) or cause.args[0].code() != exists:
                raise
            info = self._topic_info(topic, wait=True)
            if info.partitions != partitions or not exist_ok:
                raise TopicExists(
                    f"topic {topic!r} already exists with {info.partitions} partitions"
                    + ("" if exist_ok else "; pass exist_ok to use it as it is")
                ) from None
            return info
        with self._lock:
            self._partitions[topic] = partitions
        return TopicInfo(topic, partitions)

    def _topic_info(self, topic: str, *, wait: bool = False) -> TopicInfo:
        deadline = time.monotonic() + (self.timeout if wait else 0)
        while topic not in self._partitions:
            self._topics()  # never names the topic: some brokers create a topic asked about
            if topic in self._partitions or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if topic not in self._partitions:
            raise UnknownTopic(self._unknown(topic))
        return TopicInfo(topic, self._partitions[topic])

    def _topics(self) -> list[str]:
        metadata = self._call("list topics", lambda: self._admin.list_topics(timeout=self.timeout))
        found = {
            name: len(meta.partitions)
            for name, meta in metadata.topics.items()
            if meta.error is None and meta.partitions and not name.startswith("__")
        }
        with self._lock:
            self._partitions.update(found)  # partition counts never change
        return list(found)

    # -- records --------------------------------------------------------------------------------

    def _append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        producer: str | None,
        sequences: Sequence[int] | None,
    ) -> AppendResult:
        if producer is None or sequences is None:
            no_headers: list[tuple[Header, ...]] = [()] * len(records)
            return AppendResult(list(self._produce(topic, partition, records, no_headers)))
        key = (producer, topic, partition)
        with self._sequence_lock(key):
            last = self._last_sequence(topic, partition, producer)
            accepted, new_last = accept_sequences(last, sequences)
            chosen = [index for index, ok in enumerate(accepted) if ok]
            offsets: list[int | None] = [None] * len(records)
            if not chosen:
                return AppendResult(offsets)
            name = producer.encode()
            tags = [
                ((PRODUCER_HEADER, name), (SEQUENCE_HEADER, b"%d" % sequences[i])) for i in chosen
            ]
            try:
                written = self._produce(topic, partition, [records[i] for i in chosen], tags)
            except BaseException:
                with self._lock:  # what reached the log is unknown: the next use reads the tail
                    self._last.pop(key, None)
                raise
            with self._lock:
                self._last[key] = new_last
            self._commit_hint(producer, topic, partition, written[0])
        for index, offset in zip(chosen, written, strict=True):
            offsets[index] = offset
        return AppendResult(offsets)

    def _produce(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        tags: Sequence[tuple[Header, ...]],
    ) -> list[int]:
        delivery = _Delivery(len(records))
        queued = 0
        deadline = time.monotonic() + self.timeout
        try:
            with self._produce_lock:  # queued together, so stored with consecutive offsets
                for index, record in enumerate(records):
                    timestamp = now_ms() if record.timestamp is None else record.timestamp
                    while True:
                        try:
                            self._producer.produce(
                                topic,
                                value=bytes(record.value),
                                key=None if record.key is None else bytes(record.key),
                                partition=partition,
                                headers=[*record.headers, *tags[index]],
                                timestamp=timestamp,
                                on_delivery=functools.partial(delivery.report, index),
                            )
                            break
                        except BufferError:  # the local queue is full: let deliveries drain
                            if time.monotonic() > deadline:
                                raise
                            time.sleep(0.01)
                    queued += 1
        except (BufferError, KafkaException) as error:
            delivery.settle(len(records) - queued)
            delivery.done.wait(self.timeout + 5)  # what was queued is stored or failed first
            cause = error.args[0] if isinstance(error, KafkaException) else "local queue full"
            raise self._error(f"append to {topic!r}", cause, topic) from error
        if not delivery.done.wait(self.timeout + 5):
            raise self._error(f"append to {topic!r}", "no delivery report in time", topic)
        if delivery.errors:
            raise self._error(f"append to {topic!r}", delivery.errors[0], topic)
        self._note_end(topic, partition, max(delivery.offsets) + 1)
        return delivery.offsets

    def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool = True,
    ) -> list[LogRecord]:
        return self._read_at(topic, partition, offset, max_records, max_bytes, headers)[0]

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
        found, position = self._fetch(topic, partition, offset, max_records, max_bytes, retry)
        if not headers:
            return [r._replace(headers=()) for r in found], position
        own = [
            LogRecord(r.partition, r.offset, r.key, r.value, _own(r.headers), r.timestamp)
            for r in found
        ]
        return own, position

    def _fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        limit: int,
        max_bytes: int,
        fresh: bool = False,
    ) -> tuple[list[LogRecord], int]:
        """Records from ``offset`` on, all headers kept, up to the limits or the partition's end,
        and the reader's position after them (past any transaction marker it stepped over).

        ``fresh``: assign the partition anew rather than go on polling it, so that the client
        fetches again (it reports a partition's end once per position).
        """
        end = self._known_end(topic, partition)
        if offset >= end:
            end = self._partition_ends(topic, [partition])[partition]
            if offset >= end:
                return [], offset
        with self._reader_lock:
            try:
                if fresh or self._position is None or self._position[:2] != (topic, partition):
                    if self._position is not None:
                        self._reader.unassign()
                    self._learn(topic)
                    self._reader.assign([TopicPartition(topic, partition, offset)])
                elif self._position[2] != offset:
                    self._reader.seek(TopicPartition(topic, partition, offset))
                self._position = (topic, partition, offset)
                starts, ends = {partition: offset}, {partition: end}
                records = self._poll(self._reader, topic, starts, ends, limit, max_bytes)
                position = starts[partition]
                self._position = (topic, partition, position)
                if position >= self._known_end(topic, partition):
                    self._position = None  # caught up: stop the reader's idle fetch loop
            except BaseException:
                self._position = None
                raise
            finally:
                if self._position is None:
                    self._reader.unassign()
        return records, position

    def _learn(self, topic: str) -> None:
        """Have the reader look ``topic`` up before its first assignment to it.

        librdkafka does not ask for the metadata of a topic it is assigned but has not seen: it
        waits for its once-a-second scan of unknown topics, so a process's first read of each
        topic stalled for up to a second (the sink's tail read in half the first micro-batches).
        """
        if topic in self._reader_topics:
            return
        self._call(f"look up {topic!r}", lambda: self._reader.list_topics(topic, self.timeout))
        self._reader_topics.add(topic)

    def _poll(
        self,
        consumer: Consumer,
        topic: str,
        starts: dict[int, int],
        ends: dict[int, int],
        limit: int = _NO_LIMIT,
        max_bytes: int = _NO_LIMIT,
    ) -> list[LogRecord]:
        """Poll the assigned partitions until each reaches its end, or until the limits.

        ``starts`` holds each partition's next offset and is advanced as records arrive.
        """
        records: list[LogRecord] = []
        size = 0
        pending = {p for p, start in starts.items() if start < ends.get(p, start + 1)}
        deadline = time.monotonic() + self.timeout
        problem: object = "no answer"
        while pending and len(records) < limit and size < max_bytes:
            message = consumer.poll(0.1)
            if message is None:
                if time.monotonic() > deadline:
                    raise self._error(f"read from {topic!r}", problem, topic)
                continue
            partition, offset, error = message.partition(), message.offset(), message.error()
            if message.topic() != topic or partition not in pending or offset is None:
                continue
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._note_end(topic, partition, offset)
                    # the consumer is now at the end, past any transaction marker: record that,
                    # or a later read from the marker's offset would wait for a second EOF
                    starts[partition] = max(starts[partition], offset)
                    pending.discard(partition)
                elif error.code() in _UNKNOWN:
                    raise self._error(f"read from {topic!r}", error, topic)
                problem = error
                continue
            if offset < starts[partition]:
                continue  # left over from an earlier position
            key, value, headers = message.key(), message.value() or b"", _headers(message)
            records.append(
                LogRecord(partition, offset, key, value, headers, message.timestamp()[1])
            )
            size += len(value) + len(key or b"") + sum(len(n) + len(v) for n, v in _own(headers))
            starts[partition] = offset + 1
            self._note_end(topic, partition, offset + 1)
            if offset + 1 >= ends.get(partition, _NO_LIMIT):
                pending.discard(partition)
        return records

    def _end_offsets(self, topic: str) -> dict[int, int]:
        return self._partition_ends(topic, list(range(self._topic_info(topic).partitions)))

    def _end_offset(self, topic: str, partition: int) -> int:
        return self._partition_ends(topic, [partition])[partition]

    def _partition_ends(self, topic: str, partitions: list[int]) -> dict[int, int]:
        # TANSU QUIRK: Tansu (v0.6) reports the high watermark (ListOffsets, hence
        # get_watermark_offsets) as the base offset of the last batch + 1, not the last offset + 1,
        # though its fetches return every record. So read from watermark - 1 to the end of the
        # partition: one record on Kafka, the rest of the last batch on Tansu.
        with self._prober_lock:
            starts: dict[int, int] = {}
            for partition in partitions:
                watermarks = functools.partial(
                    self._prober.get_watermark_offsets,
                    TopicPartition(topic, partition),
                    timeout=self.timeout,
                )
                low, high = self._call(f"read the end of {topic!r}", watermarks, topic)
                self._note_end(topic, partition, high)
                if high > low:
                    starts[partition] = high - 1
            if starts:
                self._prober.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
                try:
                    self._poll(self._prober, topic, starts, {})  # notes each end it reaches
                finally:
                    self._prober.unassign()
        return {partition: self._known_end(topic, partition) for partition in partitions}

    def _known_end(self, topic: str, partition: int) -> int:
        with self._lock:
            return self._ends.get((topic, partition), 0)

    def _note_end(self, topic: str, partition: int, end: int) -> None:
        with self._lock:
            if end > self._ends.get((topic, partition), 0):
                self._ends[(topic, partition)] = end

    def _open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter:
        return KafkaWriter(self, topic, partition, writer_id)

    # -- consumer groups ------------------------------------------------------------------------

    def _commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        positions = [TopicPartition(topic, p, o) for p, o in offsets.items()]
        consumer = self._group(group)
        self._call("commit offsets", lambda: consumer.commit(offsets=positions, asynchronous=False))

    def _committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        positions = [TopicPartition(topic, p) for p in range(self._topic_info(topic).partitions)]
        consumer = self._group(group)
        found = self._call(
            "read committed offsets", lambda: consumer.committed(positions, timeout=self.timeout)
        )
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def _group(self, group: str) -> Consumer:
        with self._lock:
            if group not in self._groups:
                self._groups[group] = self._consumer({"group.id": group})
            return self._groups[group]

    # -- producer idempotency -------------------------------------------------------------------

    def _last_sequence(self, topic: str, partition: int, producer: str) -> int | None:
        key = (producer, topic, partition)
        with self._sequence_lock(key):
            if key not in self._last:
                last = self._scan_tail(topic, partition, producer)
                with self._lock:
                    self._last[key] = last
            return self._last[key]

    def _scan_tail(self, topic: str, partition: int, producer: str) -> int | None:
        """The highest sequence id of ``producer`` from its hint to the end of the partition."""
        name = producer.encode()
        try:
            hints = self._group(HINT_GROUP_PREFIX + producer).committed(
                [TopicPartition(topic, partition)], timeout=self.timeout
            )
            start = max(0, hints[0].offset)
        except KafkaException:
            start = 0  # only a hint: scan the whole partition
        while True:
            last: int | None = None
            hint_ok = start == 0
            offset = start
            end = self._end_offset(topic, partition)
            for batch in read_through(
                lambda at, retry: self._fetch(topic, partition, at, 1000, 16 << 20, retry),
                offset,
                end,
                self.read_patience,
                f"{topic!r} partition {partition}",
            ):
                for record in batch:
                    headers = dict(record.headers)
                    if headers.get(PRODUCER_HEADER) != name:
                        continue
                    hint_ok = hint_ok or record.offset == start
                    with contextlib.suppress(ValueError):
                        sequence = int(headers.get(SEQUENCE_HEADER, b""))
                        last = sequence if last is None else max(last, sequence)
            if hint_ok:
                return last
            start = 0  # the hint is not at one of the producer's records: it is stale

    def _commit_hint(self, producer: str, topic: str, partition: int, offset: int) -> None:
        with contextlib.suppress(KafkaException):  # a lost hint only lengthens the next scan
            self._group(HINT_GROUP_PREFIX + producer).commit(
                offsets=[TopicPartition(topic, partition, offset)], asynchronous=True
            )

    def _sequence_lock(self, key: tuple[str, str, int]) -> threading.RLock:
        with self._lock:
            return self._sequence_locks.setdefault(key, threading.RLock())

    # -- life cycle -----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._poller.join()
        self._producer.flush(self.timeout)
        for consumer in [self._reader, self._prober, *self._groups.values()]:
            consumer.close()

    def _poll_producer(self) -> None:
        """Serve delivery reports for every thread's appends."""
        while not self._closed.is_set():
            self._producer.poll(0.05)

    # -- helpers --------------------------------------------------------------------------------

    def _consumer(self, config: dict[str, Any]) -> Consumer:
        return Consumer(self._consumer_config(config))

    def _consumer_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A consumer's settings: ``config`` under the URL's options."""
        defaults = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}
        return {**defaults, "allow.auto.create.topics": False, **config, **self._common}

    def _call(self, what: str, call: Callable[[], _T], topic: str | None = None) -> _T:
        try:
            return call()
        except KafkaException as error:
            raise self._error(what, error.args[0], topic) from error
        except concurrent.futures.TimeoutError as error:
            raise self._error(what, "timed out", topic) from error

    def _unknown(self, topic: str) -> str:
        return (
            f"topic {topic!r} does not exist in {self.url}; "
            f"create it with: exactly log create {topic} --partitions N"
        )

    def _error(self, what: str, error: object, topic: str | None) -> LogError:
        code = error.code() if isinstance(error, KafkaError) else None
        if code == KafkaError.MSG_SIZE_TOO_LARGE:
            return RecordTooLarge(
                f"{self.url} refused a record as too large ({self._scrub(error)}); raise the "
                "topic's max.message.bytes or lower log.max_record_bytes"
            )
        if code in _UNKNOWN and topic is not None:
            with self._lock:  # a client that lost its broker says "unknown" too: ask again
                self._partitions.pop(topic, None)
            try:
                self._topic_info(topic)
            except LogError as found:
                return found
        return LogUnavailable(
            f"could not {what} on the Kafka log at {self.url} ({self._scrub(error)}); check that "
            "the broker is running and reachable (exactly doctor)"
        )

    def _scrub(self, error: object) -> str:
        """A client library's message with this log's secrets masked, should it quote one."""
        return scrub(str(error), self._secrets)


class KafkaWriter(PartitionWriter):
    """A fenced writer of one partition: a transactional producer, one transaction per commit.

    Appends are queued to the broker without waiting; :meth:`commit` waits for all of them and
    commits the transaction, so a writer that dies before committing leaves nothing visible
    (on Kafka; see the module docstring for Tansu).
    """

    def __init__(self, log: KafkaLog, topic: str, partition: int, writer_id: str) -> None:
        self._log = log
        self.topic, self.partition, self.writer_id = topic, partition, writer_id
        self._in_transaction = False
        config = {**log._producer_config, "transactional.id": self.transactional_id}
        self._producer = Producer(config)
        self._await_broker()
        self._call("start a transactional writer", self._producer.init_transactions, log.timeout)

    def _await_broker(self) -> None:
        """Wait until a broker learned from metadata answers (at most the log's timeout).

        librdkafka drops its bootstrap connection once it learns the brokers; if the transaction
        coordinator is looked up in between, no broker is up and the lookup is retried only after
        500 ms. In the sink, where tasks start writers side by side, one start in four waited so.
        """
        deadline = time.monotonic() + self._log.timeout
        with contextlib.suppress(KafkaException):  # init_transactions reports what is wrong
            while self._producer.list_topics(self.topic, self._log.timeout).orig_broker_id < 0:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.001)

    @property
    def transactional_id(self) -> str:
        return f"exactly.{self.topic}.{self.partition}.{self.writer_id}"

    def append(self, records: Sequence[Record]) -> None:
        self._log._check_records(records)
        if not records:
            return
        if not self._in_transaction:
            self._call("begin a transaction", self._producer.begin_transaction)
            self._in_transaction = True
        deadline = time.monotonic() + self._log.timeout
        for record in records:
            while True:
                try:
                    self._producer.produce(
                        self.topic,
                        value=bytes(record.value),
                        key=None if record.key is None else bytes(record.key),
                        partition=self.partition,
                        headers=list(record.headers),
                        timestamp=now_ms() if record.timestamp is None else record.timestamp,
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    if time.monotonic() > deadline:
                        raise self._log._error(
                            f"append to {self.topic!r}", "local queue full", self.topic
                        ) from None
                    self._producer.poll(0.01)
                except KafkaException as error:
                    raise self._failure("append", error) from error
        self._producer.poll(0)

    def commit(self) -> None:
        if not self._in_transaction:
            return
        self._call("commit a transaction", self._producer.commit_transaction, self._log.timeout)
        self._in_transaction = False

    def close(self) -> None:
        if self._in_transaction:
            self._in_transaction = False
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(self._log.timeout)

    def _call(self, what: str, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except KafkaException as error:
            raise self._failure(what, error) from error

    def _failure(self, what: str, error: KafkaException) -> LogError:
        cause = error.args[0]
        if isinstance(cause, KafkaError) and cause.code() in _FENCED_CODES:
            self._in_transaction = False  # nothing left to abort: the successor ended it
            return fenced(self.topic, self.partition, self.writer_id)
        if isinstance(cause, KafkaError) and cause.txn_requires_abort():
            self.close()
        return self._log._error(what, cause, self.topic)


def _own(headers: tuple[Header, ...]) -> tuple[Header, ...]:
    """A record's own headers, without the two this backend adds."""
    return tuple((name, value) for name, value in headers if name not in _RESERVED)


def _headers(message: Message) -> tuple[Header, ...]:
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((n, v.encode() if isinstance(v, str) else v or b"") for n, v in pairs)
