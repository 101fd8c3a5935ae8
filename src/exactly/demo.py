"""The demo run by the README's first command: generated events through the log and back.

For now it exercises the foundation only: a topic is created, Segment-style track events are
appended durably (partitioned by messageId, with producer sequence ids), one batch is sent again
to show the producer-sequence dedupe, and everything is read back and checked.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from exactly.events import partition_for
from exactly.log import Log, Record

BATCH = 1000
EVENT_NAMES = ["Order Completed", "Product Viewed", "Signed Up", "Cart Viewed", "Checkout Started"]


def generate_events(count: int, seed: int = 0) -> Iterator[dict[str, object]]:
    """Segment-style track events of about 300 bytes, each with a fresh UUID messageId."""
    rng = random.Random(seed)
    base = time.time()
    for n in range(count):
        raw = os.urandom(16).hex()
        message_id = f"{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
        sent = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base + n / 1000)) + ".000Z"
        yield {
            "type": "track",
            "event": rng.choice(EVENT_NAMES),
            "messageId": message_id,
            "userId": f"user-{rng.randrange(10_000)}",
            "properties": {
                "revenue": round(rng.uniform(1, 200), 2),
                "sku": f"sku-{rng.randrange(500)}",
            },
            "context": {"library": {"name": "analytics-python", "version": "2.3.2"}},
            "timestamp": sent,
            "sentAt": sent,
        }


@dataclass
class DemoResult:
    topic: str
    partitions: int
    appended: int = 0
    bytes_appended: int = 0
    append_seconds: float = 0.0
    resent: int = 0
    resent_dropped: int = 0
    read: int = 0
    read_seconds: float = 0.0
    distinct_ids: int = 0
    per_partition: dict[int, int] = field(default_factory=dict)


def run_demo(log: Log, topic: str, partitions: int, events: int) -> DemoResult:
    info = log.create_topic(topic, partitions, exist_ok=True)
    start = log.end_offsets(topic)
    result = DemoResult(topic, info.partitions)
    producer = f"demo-{os.getpid()}-{time.time_ns()}"

    batches: dict[int, list[list[Record]]] = {p: [[]] for p in range(info.partitions)}
    for event in generate_events(events):
        value = json.dumps(event, separators=(",", ":")).encode()
        message_id = str(event["messageId"])
        partition = partition_for(message_id, info.partitions)
        if len(batches[partition][-1]) == BATCH:
            batches[partition].append([])
        batches[partition][-1].append(Record(value, key=message_id.encode()))
        result.bytes_appended += len(value)

    def append_partition(partition: int) -> None:
        sequence = 0
        for batch in batches[partition]:
            sequences = list(range(sequence, sequence + len(batch)))
            log.append(topic, partition, batch, producer=producer, sequences=sequences)
            sequence += len(batch)

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(info.partitions, 4)) as pool:
        list(pool.map(append_partition, range(info.partitions)))
    result.append_seconds = time.perf_counter() - began
    result.appended = events

    # A producer that retries its last batch after a crash: every record is a duplicate.
    last = batches[0][-1]
    if last:
        last_seq = log.last_sequence(topic, 0, producer) or 0
        resend = log.append(
            topic,
            0,
            last,
            producer=producer,
            sequences=list(range(last_seq - len(last) + 1, last_seq + 1)),
        )
        result.resent, result.resent_dropped = len(last), resend.duplicates

    began = time.perf_counter()
    ids: set[bytes] = set()
    for partition in range(info.partitions):
        offset, count = start[partition], 0
        while batch := log.read(topic, partition, offset, max_records=5000):
            count += len(batch)
            ids.update(record.key or b"" for record in batch)
            offset = batch[-1].offset + 1
        result.per_partition[partition] = count
    result.read_seconds = time.perf_counter() - began
    result.read = sum(result.per_partition.values())
    result.distinct_ids = len(ids)
    return result
