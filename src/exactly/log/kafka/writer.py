"""Fenced writers of a Kafka log (DESIGN.md boundary 4): transactional producers.

A writer's ``transactional.id`` is ``exactly.<topic>.<partition>.<writer id>``:
``init_transactions`` of a new writer fences the older producer of that id (its later produce
and commit fail with PRODUCER_FENCED, raised as :class:`~exactly.errors.Fenced`) and ends its
open transaction; each :meth:`~exactly.log.base.PartitionWriter.commit` commits one
transaction, whose marker takes one offset. TANSU QUIRK: Tansu (v0.6) fences correctly but does
not hide aborted transactions from ``read_committed`` readers: what a fenced producer produced
before it was fenced stays visible. The sink is exactly-once either way because its successor
reads the tail with the same isolation as every reader: records visible to readers are the
records it counts as written.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from exactly.errors import LogError
from exactly.log.base import PartitionWriter, Record, fenced, now_ms
from exactly.log.kafka.client import KafkaClient

_FENCED_CODES = {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED}


class KafkaWriter(PartitionWriter):
    """A fenced writer of one partition: a transactional producer, one transaction per commit.

    Appends are queued to the broker without waiting; :meth:`commit` waits for all of them and
    commits the transaction, so a writer that dies before committing leaves nothing visible
    (on Kafka; see the module docstring for Tansu).
    """

    def __init__(self, log: KafkaClient, topic: str, partition: int, writer_id: str) -> None:
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
