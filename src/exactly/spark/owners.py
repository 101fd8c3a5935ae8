"""Which streaming query's sink writes a topic: one at a time, recorded in the log itself.

The registry is the one-partition topic ``exactly.sinks``. Each record is keyed by the topic it
concerns and holds JSON: a ``claim`` (sink id, checkpoint, and each partition's end offset when
the claim was made) or a ``release``. Folding the records in log order gives each topic's owner:
a claim counts only when the topic has no owner, a release only when it names the owner. Because
a single partition orders every append, two queries claiming a topic at the same moment cannot
both win: the claim appended first does, and each claimant reads the registry back to learn which.

The recorded end offsets bound the sink's tail reads: nothing of a sink lies before its claim.
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
CLAIM, RELEASE = "claim", "release"


@dataclass(frozen=True)
class Claim:
    topic: str
    sink: str
    checkpoint: str | None = None
    starts: dict[int, int] = field(default_factory=dict)
    at: int = 0

    def describe(self) -> str:
        where = self.checkpoint or "unknown: pass checkpointLocation as an option to see it"
        return f"sink {self.sink}, checkpoint {where}"


def owner(log: Log, topic: str) -> Claim | None:
    """The claim that owns ``topic`` now, None if no sink does."""
    current: Claim | None = None
    for entry in _entries(log, topic):
        action, sink = entry.get("action"), entry.get("sink")
        if action == CLAIM and current is None and isinstance(sink, str):
            starts = {int(p): int(o) for p, o in (entry.get("starts") or {}).items()}
            current = Claim(topic, sink, entry.get("checkpoint"), starts, int(entry.get("at", 0)))
        elif action == RELEASE and current is not None and sink == current.sink:
            current = None
    return current


def claim(log: Log, topic: str, sink: str, checkpoint: str | None) -> Claim:
    """Make ``sink`` the owner of ``topic`` (or confirm it is); TopicOwned if another sink is."""
    current = owner(log, topic)
    if current is None:
        entry = {
            "action": CLAIM,
            "topic": topic,
            "sink": sink,
            "checkpoint": checkpoint,
            "starts": {str(p): o for p, o in sorted(log.end_offsets(topic).items())},
            "at": now_ms(),
        }
        _append(log, topic, entry)
        current = owner(log, topic)  # whoever appended first won
    if current is None or current.sink != sink:
        raise TopicOwned(refusal(topic, current))
    return current


def release(log: Log, topic: str, sink: str | None = None) -> Claim | None:
    """End the current claim on ``topic`` (only if it is ``sink``'s, when given); returns it."""
    current = owner(log, topic)
    if current is None or (sink is not None and current.sink != sink):
        return None
    _append(log, topic, {"action": RELEASE, "topic": topic, "sink": current.sink, "at": now_ms()})
    return current


def check(log: Log, topic: str, sink: str | None) -> None:
    """Raise TopicOwned if a sink other than ``sink`` (any sink, if None) owns ``topic``."""
    current = owner(log, topic)
    if current is not None and current.sink != sink:
        raise TopicOwned(refusal(topic, current))


def refusal(topic: str, current: Claim | None) -> str:
    who = current.describe() if current is not None else "another query"
    return (
        f"topic {topic!r} is written by another streaming query ({who}); one sink per topic "
        f"keeps it exactly-once: stop that query and run `exactly sink release {topic}`, "
        "or write to another topic"
    )


_claims: dict[tuple[str, str, str], Claim] = {}
_claims_lock = threading.Lock()


def claim_once(log: Log, topic: str, sink: str, checkpoint: str | None) -> Claim:
    """:func:`claim`, remembered for this process: tasks after the first read no registry.

    Sound because a claim ends only by an explicit release, made once its query has stopped.
    """
    key = (log.url, topic, sink)
    with _claims_lock:
        found = _claims.get(key)
    if found is None:
        found = claim(log, topic, sink, checkpoint)
        with _claims_lock:
            _claims[key] = found
    return found


def check_once(log: Log, topic: str, sink: str | None) -> None:
    """:func:`check`, remembered for this process once ``sink`` is seen to own ``topic``."""
    key = (log.url, topic, sink or "")
    with _claims_lock:
        if sink is not None and key in _claims:
            return
    current = owner(log, topic)
    if current is not None and current.sink != sink:
        raise TopicOwned(refusal(topic, current))
    if current is not None and sink is not None:
        with _claims_lock:
            _claims[key] = current


def _entries(log: Log, topic: str) -> list[dict[str, Any]]:
    try:
        log.describe(REGISTRY)
    except UnknownTopic:
        return []
    wanted = topic.encode()
    entries = []
    offset = 0
    while batch := log.read(REGISTRY, 0, offset, max_records=1000):
        for record in batch:
            if record.key == wanted:
                try:
                    entry = json.loads(record.value)
                except ValueError:
                    continue
                if isinstance(entry, dict):
                    entries.append(entry)
        offset = batch[-1].offset + 1
    return entries


def _append(log: Log, topic: str, entry: dict[str, Any]) -> None:
    log.create_topic(REGISTRY, 1, exist_ok=True)
    log.append(REGISTRY, 0, [Record(json.dumps(entry).encode(), key=topic.encode())])
