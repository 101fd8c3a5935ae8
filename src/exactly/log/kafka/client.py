"""The clients of a Kafka log, their configuration and their errors; topics through the admin
client and consumer groups.

Query options go into the librdkafka configuration of every client, e.g. ``?linger.ms=5``. An
option's value may be ``env:NAME`` or ``file:PATH`` (:func:`exactly.urls.resolve`), so that
secrets such as ``sasl.password`` stay out of the URL. :attr:`KafkaClient.url`, and so every
message, shows the URL with secrets masked (:func:`exactly.urls.redact`); the real values live
only in the clients' configuration.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, Self, TypeVar
from urllib.parse import parse_qsl

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
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
from exactly.log.base import DEFAULT_MAX_RECORD_BYTES, Log, TopicInfo
from exactly.urls import is_secret_option, redact, resolve, scrub

FORCED = {"enable.idempotence": True, "acks": "all"}
READER = {
    "group.id": "exactly.reader",
    "enable.partition.eof": True,
    # Tansu answers a fetch inside a batch only after this wait, and every read that reaches a
    # partition's end (an end probe, the sink's tail read) ends with one: 10 ms made the sink's
    # tail read 46 ms; 3 ms, 16 ms (1 ms once stalled a writer's start for 0.5 s).
    "fetch.wait.max.ms": 3,
}
UNKNOWN = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
}
NO_LIMIT = 1 << 62
_T = TypeVar("_T")


class KafkaClient(Log):
    """What every part of the Kafka log shares: the clients (an admin client, an idempotent
    producer, a reader, an end prober, one consumer per group), the state the parts keep, and
    the turning of a client's exception into an :mod:`exactly.errors` one.

    The clients are all made here, so that an option librdkafka refuses fails once, as
    :class:`~exactly.errors.InvalidLogURL`.
    """

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
        for name, value in FORCED.items():
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
        self._producer_config: dict[str, Any] = {**producer, **self._common, **FORCED}
        try:
            self._admin = AdminClient(self._common)
            self._producer = Producer(self._producer_config)
            self._reader = self._consumer(READER)
            self._prober = self._consumer(READER)
        except KafkaException as error:
            raise InvalidLogURL(
                f"{self.url}: {self._scrub(error.args[0])}; check the options after '?'"
            ) from None
        self._lock = threading.Lock()  # guards the dictionaries below
        self._partitions: dict[str, int] = {}
        self._groups: dict[str, Consumer] = {}
        # reads (fetch.py)
        self._reader_lock = threading.Lock()
        self._prober_lock = threading.Lock()
        self._ends: dict[tuple[str, int], int] = {}
        self._position: tuple[str, int, int] | None = None  # what the reader polls next
        self._reader_topics: set[str] = set()  # topics whose metadata the reader has
        # appends (append.py)
        self._produce_lock = threading.Lock()
        self._last: dict[tuple[str, str, int], int | None] = {}
        self._sequence_locks: dict[tuple[str, str, int], threading.RLock] = {}
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._poll_producer, name="kafka-log", daemon=True)
        self._poller.start()

    @classmethod
    def from_url(cls, rest: str, **options: Any) -> Self:
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
        if code in UNKNOWN and topic is not None:
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
