"""Segment-style events for the aggregate tests, and their counts recomputed in plain Python.

Events spread over a few minutes, some late (their timestamp minutes before the ones around
them), from two sources and three types; ``properties.revenue`` is a number, a numeric string,
text, an object or missing, so that only numbers are summed. The recount here shares no code
with the job: it is the truth the tables are compared with.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from exactly.events import partition_for
from exactly.log import Log, Record

BASE_MINUTE = 28_400_000  # 2024-01-01T00:00 UTC is minute 28,401,120; any fixed start works
NAMES = ["Order Completed", "Product Viewed", "Signed Up"]
PLANS = ["free", "pro", "team"]
SIX = Decimal("0.000001")


def timestamp(minute: int, second: float) -> str:
    from datetime import UTC, datetime, timedelta

    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(minutes=minute, seconds=second)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def minute_text(minute: int) -> str:
    return timestamp(minute, 0)[:16].replace("T", " ") + ":00"


@dataclass
class EventStream:
    """Events numbered from 0; ``duplicate_rate`` of the records in raw repeat an earlier id."""

    seed: int = 11
    minutes: int = 5
    duplicate_rate: float = 0.006
    sent: int = 0
    events: dict[str, dict[str, Any]] = field(default_factory=dict)  # first of each id
    order: list[str] = field(default_factory=list)
    duplicates: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _event(self, n: int) -> dict[str, Any]:
        rng = self.rng
        minute = BASE_MINUTE + rng.randrange(self.minutes)
        if rng.random() < 0.05:
            minute -= rng.randrange(1, 30)  # late: it belongs to a minute long past
        kind = rng.choice(["track", "track", "track", "page", "identify"])
        event: dict[str, Any] = {
            "type": kind,
            "messageId": f"m-{self.seed}-{n:08d}-{rng.getrandbits(32):08x}",
            "userId": f"u-{rng.randrange(100)}",
            "sourceId": rng.choice(["web", "ios"]),
            "timestamp": timestamp(minute, rng.uniform(0, 59.999)),
            "receivedAt": timestamp(BASE_MINUTE + self.minutes, 0),
            "context": {"library": {"name": "analytics-python", "version": "2.3"}},
        }
        if kind == "track":
            event["event"] = rng.choice(NAMES)
        properties: dict[str, Any] = {"plan": rng.choice(PLANS)}
        roll = rng.random()
        if roll < 0.5:
            properties["revenue"] = round(rng.uniform(0, 500), 2)
        elif roll < 0.6:
            properties["revenue"] = rng.randrange(100)
        elif roll < 0.65:
            properties["revenue"] = f"{rng.uniform(0, 50):.2f}"
        elif roll < 0.7:
            properties["revenue"] = rng.choice(["n/a", {"amount": 3}, True, None, [1]])
        if rng.random() < 0.5:
            properties["seats"] = rng.randrange(1, 10)
        event["properties"] = properties
        if kind == "identify":  # the newest of them is the user's row in the segment layout
            event["traits"] = {"plan": properties["plan"], "logins": n, "firstEvent": n % 7 == 0}
        return event

    def chunk(self, count: int) -> Iterator[tuple[str, bytes]]:
        """The next ``count`` raw records as (messageId, value); a repeat has another payload."""
        for _ in range(count):
            if self.order and self.rng.random() < self.duplicate_rate:
                message_id = self.rng.choice(self.order[-500:])
                again = dict(self.events[message_id], userId="retry")
                self.duplicates += 1
                yield message_id, json.dumps(again).encode()
                continue
            event = self._event(self.sent)
            self.sent += 1
            self.events[event["messageId"]] = event
            self.order.append(event["messageId"])
            yield event["messageId"], json.dumps(event).encode()


def append(log: Log, topic: str, partitions: int, records: Iterable[tuple[str, bytes]]) -> int:
    by_partition: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for message_id, value in records:
        key = message_id.encode()
        by_partition[partition_for(message_id, partitions)].append(Record(value, key=key))
    total = 0
    for partition, found in by_partition.items():
        for at in range(0, len(found), 1000):
            log.append(topic, partition, found[at : at + 1000])
        total += len(found)
    return total


def revenue(value: Any) -> Decimal:
    if isinstance(value, bool) or value is None:
        return Decimal(0)
    if isinstance(value, int | float | str):
        try:
            return Decimal(str(value)).quantize(SIX)
        except ArithmeticError:
            return Decimal(0)
    return Decimal(0)


def event_counts(events: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows of ``event_counts`` (keys as text, count, revenue) for these distinct events."""
    out: dict[tuple[str, ...], list[Any]] = {}
    for event in events:
        minute = event["timestamp"][:16].replace("T", " ") + ":00"
        key = (event["sourceId"], event["type"], event.get("event", ""), minute)
        row = out.setdefault(key, [0, Decimal(0).quantize(SIX)])
        row[0] += 1
        row[1] += revenue(event["properties"].get("revenue"))
    return [(*key, count, total) for key, (count, total) in sorted(out.items())]


def plan_counts(events: Iterable[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows of the test's user-defined table: by plan and hour, events and seats."""
    out: dict[tuple[str, ...], list[int]] = {}
    for event in events:
        hour = event["timestamp"][:13].replace("T", " ") + ":00:00"
        row = out.setdefault((event["properties"]["plan"], hour), [0, 0])
        row[0] += 1
        row[1] += int(event["properties"].get("seats", 0))
    return [(*key, count, seats) for key, (count, seats) in sorted(out.items())]


PLAN_TABLE = {
    "name": "plan_hours",
    "group_by": {"plan": "properties.plan", "hour": "hour"},
    "measures": {"events": "count(*)", "seats": "sum(try_cast(properties.seats AS INT))"},
}
