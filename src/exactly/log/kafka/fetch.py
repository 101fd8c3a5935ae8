"""Reading a Kafka log: fetches from one partition at a time, and each partition's end.

Reads strip the two headers an append with a producer name adds (:mod:`.append`), so every
backend returns the same headers.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from exactly.errors import LogUnavailable
from exactly.log.base import RESERVED_HEADERS, Header, LogRecord
from exactly.log.kafka.client import NO_LIMIT, READER, UNKNOWN, KafkaClient

_RESERVED = RESERVED_HEADERS  # checked for every backend in Log._check_records
_NO_ANSWER = "no answer"
# a read or an end probe that hears nothing at all for the log's timeout tries again with a new
# consumer (new connections: within one consumer a read heard nothing for 126 s while the same
# process's other partitions were read, and the broker answered the same read at once later),
# and fails after this many tries: 120 s at the default timeout of 10 s, as long as Spark's own
# Kafka source waits for a poll (spark.network.timeout). Silences met where the broker answered
# again afterwards: the copy crash test's source 10 s at load 9, twice at load 15-18, 20 s at
# load 13 (2026-12-01); an end probe over 30 s at load 18, and a read 126 s at load 15, each
# ending that test's run (2026-12-02)
SILENT_TRIES = 12


class _Silent(LogUnavailable):
    """A poll that got no message, no end and no error for the log's timeout."""


class KafkaReading(KafkaClient):
    """Reads: one reader consumer polled by one thread at a time, assigned to a partition and
    kept there while its reads go on from where the last stopped; a second consumer probes
    partitions' ends."""

    silent_tries = SILENT_TRIES

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
                for attempt in range(1, self.silent_tries + 1):
                    if (
                        fresh
                        or attempt > 1
                        or self._position is None
                        or self._position[:2] != (topic, partition)
                    ):
                        if self._position is not None:
                            self._reader.unassign()
                        self._learn(topic)
                        self._reader.assign([TopicPartition(topic, partition, offset)])
                    elif self._position[2] != offset:
                        self._reader.seek(TopicPartition(topic, partition, offset))
                    self._position = (topic, partition, offset)
                    starts, ends = {partition: offset}, {partition: end}
                    try:
                        records = self._poll(self._reader, topic, starts, ends, limit, max_bytes)
                        break
                    except _Silent:
                        # nothing at all for the timeout, as the probe below met too
                        # (SILENT_TRIES): a new consumer fetches again before the read gives up
                        if attempt == self.silent_tries or starts[partition] != offset:
                            raise
                        self._reader = self._fresh(self._reader)
                        self._reader_topics.clear()
                        self._position = None
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
        limit: int = NO_LIMIT,
        max_bytes: int = NO_LIMIT,
    ) -> list[LogRecord]:
        """Poll the assigned partitions until each reaches its end, or until the limits.

        ``starts`` holds each partition's next offset and is advanced as records arrive. It
        fails when no message comes for ``timeout`` seconds: a long read that keeps receiving
        (a loaded machine, a large range) goes on.
        """
        records: list[LogRecord] = []
        size = 0
        pending = {p for p, start in starts.items() if start < ends.get(p, start + 1)}
        deadline = time.monotonic() + self.timeout
        problem: object = _NO_ANSWER
        while pending and len(records) < limit and size < max_bytes:
            message = consumer.poll(0.1)
            if message is None:
                if time.monotonic() > deadline:
                    waiting = ", ".join(f"{p} at {starts[p]}" for p in sorted(pending))
                    what = f"read from {topic!r} (partition {waiting})"
                    failed = self._error(what, problem, topic)
                    raise _Silent(str(failed)) if problem is _NO_ANSWER else failed
                continue
            partition, offset, error = message.partition(), message.offset(), message.error()
            if message.topic() != topic or partition not in pending or offset is None:
                continue
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    deadline = time.monotonic() + self.timeout  # progress: the wait starts again
                    self._note_end(topic, partition, offset)
                    # the consumer is now at the end, past any transaction marker: record that,
                    # or a later read from the marker's offset would wait for a second EOF
                    starts[partition] = max(starts[partition], offset)
                    pending.discard(partition)
                    continue  # (not a problem: a partition's end)
                if error.code() in UNKNOWN:
                    raise self._error(f"read from {topic!r}", error, topic)
                problem = error
                continue
            if offset < starts[partition]:
                continue  # left over from an earlier position
            deadline = time.monotonic() + self.timeout  # progress: the wait starts again
            key, value, headers = message.key(), message.value() or b"", _headers(message)
            records.append(
                LogRecord(partition, offset, key, value, headers, message.timestamp()[1])
            )
            size += len(value) + len(key or b"") + sum(len(n) + len(v) for n, v in _own(headers))
            starts[partition] = offset + 1
            self._note_end(topic, partition, offset + 1)
            if offset + 1 >= ends.get(partition, NO_LIMIT):
                pending.discard(partition)
        return records

    def _start_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        """The low watermarks: where retention left each partition."""
        starts: dict[int, int] = {}
        with self._prober_lock:
            for partition in range(partitions):
                watermarks = functools.partial(
                    self._prober.get_watermark_offsets,
                    TopicPartition(topic, partition),
                    timeout=self.timeout,
                )
                low, _ = self._call(f"read the start of {topic!r}", watermarks, topic)
                starts[partition] = max(0, int(low))
        return starts

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
            for attempt in range(1, self.silent_tries + 1):
                if not starts:
                    break
                self._prober.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
                try:
                    self._poll(self._prober, topic, starts, {})  # notes each end it reaches
                    break
                except LogUnavailable:
                    # no record and no end for the timeout (SILENT_TRIES): a new consumer
                    # fetches again before the probe gives up
                    if attempt == self.silent_tries:
                        raise
                    self._prober = self._fresh(self._prober)
                    starts = {p: o for p, o in starts.items() if o < self._known_end(topic, p)}
                finally:
                    self._prober.unassign()
        return {partition: self._known_end(topic, partition) for partition in partitions}

    def _fresh(self, silent: Consumer) -> Consumer:
        """A new consumer in place of ``silent``; that one is closed in the background, since
        closing waits for the requests it has in flight."""
        threading.Thread(target=_close, args=(silent,), name="kafka-close", daemon=True).start()
        return self._consumer(READER)

    def _known_end(self, topic: str, partition: int) -> int:
        with self._lock:
            return self._ends.get((topic, partition), 0)

    def _note_end(self, topic: str, partition: int, end: int) -> None:
        with self._lock:
            if end > self._ends.get((topic, partition), 0):
                self._ends[(topic, partition)] = end


def _close(consumer: Consumer) -> None:
    with contextlib.suppress(Exception):  # a silent consumer set aside: its errors tell nothing
        consumer.close()


def _own(headers: tuple[Header, ...]) -> tuple[Header, ...]:
    """A record's own headers, without the two this backend adds."""
    return tuple((name, value) for name, value in headers if name not in _RESERVED)


def _headers(message: Message) -> tuple[Header, ...]:
    raw = message.headers() or []
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((n, v.encode() if isinstance(v, str) else v or b"") for n, v in pairs)
