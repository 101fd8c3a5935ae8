"""A raw stream with Segment's duplicate rate, and what ``events`` must hold after dedupe.

Duplicates (0.6% of the records by default) come in every kind the dedupe tests need: the next
record (same micro-batch), one from earlier in the chunk (same or another batch), one from an
earlier chunk (another run of the job), always with a different payload (the first received
wins). A few records have no usable messageId and must end in ``raw.rejected``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from exactly.events import partition_for
from exactly.log import Log, LogRecord, Record

RAW, EVENTS, REJECTED = "raw", "events", "raw.rejected"


@dataclass
class Stream:
    partitions: int
    seed: int = 7
    duplicate_rate: float = 0.006
    reject_rate: float = 0.001
    sent: int = 0
    seen: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def chunk(self, count: int) -> dict[int, list[Record]]:
        """The next ``count`` records, by partition, in the order they are appended."""
        out: dict[int, list[Record]] = {p: [] for p in range(self.partitions)}
        start = len(self.seen)
        previous: str | None = None
        for _ in range(count):
            n = self.sent
            self.sent += 1
            roll = self.rng.random()
            if roll < self.reject_rate:
                out[self.rng.randrange(self.partitions)].append(Record(b"not json %d" % n))
                self._count("rejected")
                continue
            if roll < self.reject_rate + self.duplicate_rate and self.seen:
                kind = self.rng.choice(["next", "chunk", "earlier"])
                if kind == "next" and previous is not None:
                    message_id = previous
                elif kind == "chunk" and len(self.seen) > start:
                    message_id = self.rng.choice(self.seen[start:])
                else:
                    kind = "earlier"
                    message_id = self.rng.choice(self.seen)
                self._count(f"duplicate {kind}")
            else:
                message_id = f"{self.seed}-{n:08d}-{self.rng.getrandbits(32):08x}"
                self.seen.append(message_id)
            value = json.dumps({"messageId": message_id, "n": n, "type": "track"}).encode()
            out[partition_for(message_id, self.partitions)].append(
                Record(value, key=message_id.encode())
            )
            previous = message_id
        return out

    def _count(self, kind: str) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def append(self, log: Log, count: int) -> None:
        for partition, records in self.chunk(count).items():
            for at in range(0, len(records), 500):
                log.append(RAW, partition, records[at : at + 500])


def read_all(log: Log, topic: str, partition: int) -> list[LogRecord]:
    return [r for batch in log.read_range(topic, partition, 0, max_records=5000) for r in batch]


def expected_events(log: Log, partition: int) -> list[tuple[bytes, bytes, int]]:
    """(key, value, source offset) of the first record of each messageId in raw, in order."""
    seen: set[bytes] = set()
    out = []
    for record in read_all(log, RAW, partition):
        if record.key and record.key not in seen:
            seen.add(record.key)
            out.append((record.key, record.value, record.offset))
    return out


def actual_events(log: Log, partition: int) -> list[tuple[bytes, bytes, int]]:
    from exactly.dedupe.recovery import source_offset

    out = []
    for record in read_all(log, EVENTS, partition):
        offset = source_offset(record.headers)
        assert record.key is not None and offset is not None
        out.append((record.key, record.value, offset))
    return out


def assert_deduplicated(log: Log, partitions: int) -> None:
    """``events`` is exactly the first of each messageId, per partition, in raw order."""
    for partition in range(partitions):
        want = expected_events(log, partition)
        got = actual_events(log, partition)
        if got != want:
            keys = [k for k, _, _ in got]
            doubled = len(keys) - len(set(keys))
            missing = len({k for k, _, _ in want} - set(keys))
            extra = len(set(keys) - {k for k, _, _ in want})
            raise AssertionError(
                f"partition {partition}: {len(got)} events, {len(want)} expected: "
                f"{doubled} doubled, {missing} missing, {extra} unexpected"
            )
        rejected = [r.offset for r in read_all(log, RAW, partition) if not r.key]
        from exactly.dedupe.recovery import source_offset

        routed = [source_offset(r.headers) for r in read_all(log, REJECTED, partition)]
        assert routed == rejected, f"partition {partition}: rejects {routed} != {rejected}"
