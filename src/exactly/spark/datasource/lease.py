"""Which streaming query's sink writes a topic: one at a time, by a lease recorded in the log.

The registry is the one-partition topic ``exactly.sinks``. Each record is keyed by the topic it
concerns and holds JSON: a lease taken (action ``claim`` on disk: sink id, checkpoint, and each
partition's end offset when it was taken) or a ``release``. Folding the records in log order
gives each topic's *holder*: a lease counts only when the topic has no holder, a release only
when it names the holder. Because a single partition orders every append, two queries taking a
topic's lease at the same moment cannot both win: the one appended first does, and each reads
the registry back to learn which. (Not to be confused with the dedupe store's claims of ids.)

The recorded end offsets bound the sink's tail reads: nothing of a sink lies before its lease.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from exactly.errors import TopicOwned, UnknownTopic
from exactly.log import Log, Record
from exactly.log.base import now_ms

REGISTRY = "exactly.sinks"
TAKE, RELEASE = "claim", "release"  # actions as recorded; "claim" kept for existing logs


@dataclass(frozen=True)
class TopicLease:
    topic: str
    sink: str
    checkpoint: str | None = None
    starts: dict[int, int] = field(default_factory=dict)
    at: int = 0

    def describe(self) -> str:
        where = self.checkpoint or "unknown: pass checkpointLocation as an option to see it"
        return f"sink {self.sink}, checkpoint {where}"


def holder(log: Log, topic: str) -> TopicLease | None:
    """The lease on ``topic`` now, None if no sink holds it."""
    current: TopicLease | None = None
    for entry in _entries(log, topic):
        action, sink = entry.get("action"), entry.get("sink")
        if action == TAKE and current is None and isinstance(sink, str):
            starts = {int(p): int(o) for p, o in (entry.get("starts") or {}).items()}
            current = TopicLease(
                topic, sink, entry.get("checkpoint"), starts, int(entry.get("at", 0))
            )
        elif action == RELEASE and current is not None and sink == current.sink:
            current = None
    return current


def take(log: Log, topic: str, sink: str, checkpoint: str | None) -> TopicLease:
    """Make ``sink`` the holder of ``topic`` (or confirm it is); TopicOwned if another sink is."""
    current = holder(log, topic)
    if current is None:
        entry = {
            "action": TAKE,
            "topic": topic,
            "sink": sink,
            "checkpoint": checkpoint,
            "starts": {str(p): o for p, o in sorted(log.end_offsets(topic).items())},
            "at": now_ms(),
        }
        _append(log, topic, entry)
        current = holder(log, topic)  # whoever appended first won
    if current is None or current.sink != sink:
        raise TopicOwned(refusal(topic, current))
    return current


def release(log: Log, topic: str, sink: str | None = None) -> TopicLease | None:
    """End the current lease on ``topic`` (only if ``sink`` holds it, when given); returns it."""
    current = holder(log, topic)
    if current is None or (sink is not None and current.sink != sink):
        return None
    _append(log, topic, {"action": RELEASE, "topic": topic, "sink": current.sink, "at": now_ms()})
    return current


def check(log: Log, topic: str, sink: str | None) -> None:
    """Raise TopicOwned if a sink other than ``sink`` (any sink, if None) holds ``topic``."""
    current = holder(log, topic)
    if current is not None and current.sink != sink:
        raise TopicOwned(refusal(topic, current))


def refusal(topic: str, current: TopicLease | None) -> str:
    who = current.describe() if current is not None else "another query"
    return (
        f"topic {topic!r} is written by another streaming query ({who}); one sink per topic "
        f"keeps it exactly-once: stop that query and run `exactly sink release {topic}`, "
        "or write to another topic"
    )


_leases: dict[tuple[str, str, str], TopicLease] = {}
_leases_lock = threading.Lock()


def take_once(log: Log, topic: str, sink: str, checkpoint: str | None) -> TopicLease:
    """:func:`take`, remembered for this process: tasks after the first read no registry.

    Sound because a lease ends only by an explicit release, made once its query has stopped.
    """
    key = (log.url, topic, sink)
    with _leases_lock:
        found = _leases.get(key)
    if found is None:
        found = take(log, topic, sink, checkpoint)
        with _leases_lock:
            _leases[key] = found
    return found


def check_once(log: Log, topic: str, sink: str | None) -> None:
    """:func:`check`, remembered for this process once ``sink`` is seen to hold ``topic``."""
    key = (log.url, topic, sink or "")
    with _leases_lock:
        if sink is not None and key in _leases:
            return
    current = holder(log, topic)
    if current is not None and current.sink != sink:
        raise TopicOwned(refusal(topic, current))
    if current is not None and sink is not None:
        with _leases_lock:
            _leases[key] = current


def _entries(log: Log, topic: str) -> list[dict[str, Any]]:
    try:
        log.topic_info(REGISTRY)
    except UnknownTopic:
        return []
    wanted = topic.encode()
    entries = []
    for batch in log.read_range(REGISTRY, 0, 0):
        for record in batch:
            if record.key == wanted:
                try:
                    entry = json.loads(record.value)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    entries.append(entry)
    return entries


def _append(log: Log, topic: str, entry: dict[str, Any]) -> None:
    log.create_topic(REGISTRY, 1, exist_ok=True)
    log.append(REGISTRY, 0, [Record(json.dumps(entry).encode(), key=topic.encode())])
