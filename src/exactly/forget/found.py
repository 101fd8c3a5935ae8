"""What a forget finds of a person in the log before it clears anything.

The log topics are the pipeline's source of truth: every other store was made from them. So a
forget reads the person's events there first (:func:`gather`), keeping in memory, never on
disk, what the later steps need and cannot find again once the log is rewritten: the events'
message ids (their jobs, their rows) and the text the events carry (ids, traits, properties,
context), which the logs under the data dir may quote.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from exactly.forget.regulations import ANONYMOUS, USER, Forgotten
from exactly.forget.stub import is_stub

if TYPE_CHECKING:
    from exactly.log import Log, LogRecord

SHORTEST_TRACE = 6  # characters: a shorter text value (a plan, a country) is everyone's
INTERNAL = ("exactly.",)  # topics exactly keeps for itself: no event in them


@dataclass(frozen=True)
class Person:
    """The ids a forget was given, in this process's memory only."""

    ids: Mapping[str, tuple[str, ...]]  # kind (user, anonymous) -> ids

    def needles(self) -> list[bytes]:
        """Each id as it appears inside stored JSON (escaped as orjson writes it)."""
        return [orjson.dumps(value)[1:-1] for values in self.ids.values() for value in values]

    def hint(self, data: bytes) -> bool:
        """Whether ``data`` (a stored batch, a file) may hold one of the ids: a byte search."""
        return any(needle in data for needle in self.needles())


@dataclass
class Found:
    """The person's events found in the log: message ids and the text they carry."""

    message_ids: set[str] = field(default_factory=set)
    traces: set[str] = field(default_factory=set)
    records: int = 0

    def add(self, event: Mapping[str, Any]) -> None:
        self.records += 1
        message_id = event.get("messageId")
        if isinstance(message_id, str):
            self.message_ids.add(message_id)
        for name in ("userId", "anonymousId", "previousId"):
            value = event.get(name)
            if isinstance(value, str) and value:
                self.traces.add(value)
        for name in ("traits", "properties", "context"):
            self.traces.update(
                text for text in _texts(event.get(name)) if len(text) >= SHORTEST_TRACE
            )


def _texts(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)


def event_topics(log: Log) -> list[str]:
    """The topics that may hold events: all but exactly's own."""
    return sorted(topic for topic in log.topics() if not topic.startswith(INTERNAL))


def whose(forgotten: Forgotten, record: LogRecord) -> dict[str, Any] | None:
    """The record's event if it is a forgotten person's (a stub never is)."""
    if is_stub(record.value):
        return None
    try:
        event = orjson.loads(record.value)
    except orjson.JSONDecodeError:
        return None
    if isinstance(event, dict) and forgotten.event(event):
        return event
    return None


def gather(log: Log, topics: Iterable[str], forgotten: Forgotten, person: Person | None) -> Found:
    """Read every record of ``topics`` (with ``person``, only the stored batches or records
    that hold one of the ids as bytes) and keep what the person's events carry."""
    found = Found()
    for topic in topics:
        for partition, end in log.end_offsets(topic).items():
            if not end:
                continue
            for batch in log.read_range(topic, partition, 0, end, max_records=5000):
                for record in batch:
                    if person is not None and not person.hint(record.value):
                        continue
                    event = whose(forgotten, record)
                    if event is not None:
                        found.add(event)
    return found


KINDS = (USER, ANONYMOUS)
