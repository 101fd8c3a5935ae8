"""The log on any Kafka-protocol cluster (``kafka://HOST:PORT[,HOST:PORT...][?option=value...]``).

:class:`KafkaLog` is put together from one part per concern, each a module of this package:

* :mod:`.client`: the clients, their configuration from the URL's options (secrets masked in
  every message), topics through the admin client, consumer groups, errors;
* :mod:`.fetch`: reads, and each partition's end (past Tansu's short high watermark);
* :mod:`.append`: appends, and producer idempotency from sequence headers and a tail read
  (DESIGN.md boundary 2);
* :mod:`.writer`: fenced writers, one transactional producer each (DESIGN.md boundary 4).

Each module's docstring says how its part works and why.
"""

from __future__ import annotations

from exactly.log.base import PartitionWriter
from exactly.log.kafka.append import (
    HINT_GROUP_PREFIX,
    PRODUCER_HEADER,
    SEQUENCE_HEADER,
    KafkaAppending,
)
from exactly.log.kafka.writer import KafkaWriter

__all__ = ["HINT_GROUP_PREFIX", "PRODUCER_HEADER", "SEQUENCE_HEADER", "KafkaLog", "KafkaWriter"]


class KafkaLog(KafkaAppending):
    """A log on a Kafka-protocol cluster.

    Guarantee: an append returns only once every record's delivery report from an idempotent
    producer with ``acks=all`` is OK, so its records are as durable as the cluster's in-sync
    replicas make them. The producer sequence check assumes one writer per producer name and
    partition (the contract of :class:`~exactly.log.base.Log`). Within one process the records of
    one append get consecutive offsets and appends from many threads are safe. Any call fails with
    :class:`~exactly.errors.LogUnavailable` after about ``timeout`` seconds without the cluster;
    a read, or a look for a partition's end, tries again with a new consumer after each
    ``timeout`` of silence and fails after 12 of them
    (:data:`~exactly.log.kafka.fetch.SILENT_TRIES`).
    A fenced writer (:meth:`open_writer`) commits one transaction per commit and is fenced by its
    successor (:mod:`.writer`).
    """

    # a range read waits this long for records below the range's end: a transaction left open
    # by a killed writer hides what follows it until it is aborted, within librdkafka's
    # transaction.timeout.ms (60 s) or when the writer's successor starts. TANSU QUIRK: Tansu
    # seems not to time transactions out, so the successor ends it; under load (a pipeline
    # restarting after a run of kills) that took over 90 s once, failing a read that would
    # have gone on
    read_patience = 180.0

    def _open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter:
        return KafkaWriter(self, topic, partition, writer_id)
