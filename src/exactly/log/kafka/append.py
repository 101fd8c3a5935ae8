"""Appending to a Kafka log, with producer idempotency (DESIGN.md boundary 2).

Producer idempotency is built from plain produce and fetch: each record of an append with a
producer name carries two headers, ``exactly.producer`` (the name) and ``exactly.seq`` (its
sequence id in decimal ASCII). The first time a log object meets a (producer, topic, partition)
it reads that partition's tail and takes the highest ``exactly.seq`` among the producer's
records; afterwards the last sequence lives in memory, updated after every append, and appends of
one (producer, topic, partition) are serialised by a lock. To bound the tail read, every append
commits, best effort, the offset of its first record for the consumer group
``exactly.producer.<name>``; the scan starts there (or at the start of the partition when there
is no hint, or when the record at the hint is not the producer's). The hint only shortens the
scan: correctness comes from the scan itself. Reads strip the two headers (:mod:`.fetch`).

Why not Kafka transactional ids: they fence a zombie producer, but a restarted producer learns
nothing from them about which of its records were stored, so it still needs a durable sequence
position to resume from. Headers plus a tail read give that position with no broker feature
beyond produce and fetch, so they work on every Kafka-protocol broker, Tansu included.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from exactly.log.base import AppendResult, Header, Record, accept_sequences, now_ms, read_through
from exactly.log.kafka.fetch import KafkaReading

PRODUCER_HEADER = "exactly.producer"
SEQUENCE_HEADER = "exactly.seq"
HINT_GROUP_PREFIX = "exactly.producer."


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


class KafkaAppending(KafkaReading):
    """Appends: one idempotent producer shared by every thread, an append's records queued
    together so that they get consecutive offsets, and the producer sequence check."""

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
