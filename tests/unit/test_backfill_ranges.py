"""Backfill's pure rules: what a span holds, what is left to read, chunks, the log's window."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.delivery.backfill import (
    BackfillPlan,
    check_window,
    clock,
    held_since,
    next_chunk,
    received_ms,
    remaining,
)
from exactly.delivery.jobdb.base import BACKFILL, ROUTE, Span
from exactly.delivery.settings import DestinationSettings
from exactly.errors import ConfigError

DAY = 86_400_000
CRM = DestinationSettings(name="crm", url="http://127.0.0.1:9/hook")


def route(start: dict[int, int], end: dict[int, int] | None = None) -> Span:
    return Span("crm", "events", ROUTE, "events@/cp", start, end)


def backfill(
    start: dict[int, int], end: dict[int, int], since: int | None, until: int | None
) -> Span:
    return Span("crm", "events", BACKFILL, "1", start, end, since, until)


def test_a_span_holds_its_offsets_and_its_window() -> None:
    span = backfill({0: 10}, {0: 20}, since=5 * DAY, until=6 * DAY)
    assert span.holds(0, 10, 5 * DAY)
    assert not span.holds(0, 20, 5 * DAY)  # the end is not held
    assert not span.holds(0, 9, 5 * DAY)
    assert not span.holds(0, 15, 6 * DAY)  # received at the window's end: not held
    assert not span.holds(0, 15, None)  # no time: not in a bounded window
    assert not span.holds(1, 0, 5 * DAY)  # a partition it never read
    assert route({0: 3}).holds(0, 10**9, None)  # open: everything from where it starts
    assert route({}).holds(4, 0, None)  # a partition missing from the start starts at 0


def test_a_window_within_another() -> None:
    wide = backfill({}, {}, since=DAY, until=None)
    assert wide.within(2 * DAY, 3 * DAY)
    assert wide.within(DAY, None)
    assert not wide.within(None, 3 * DAY)  # unbounded below is wider
    assert not wide.within(0, 3 * DAY)
    assert backfill({}, {}, None, None).within(None, None)


def test_left_to_read_is_below_the_route_less_what_is_held_whole() -> None:
    routes = [route({0: 100, 1: 50})]
    closed = route({0: 10}, {0: 20})  # routed once, then the destination was removed
    same = backfill({0: 30, 1: 0}, {0: 60, 1: 10}, since=DAY, until=None)
    narrower = backfill({0: 70}, {0: 90}, since=2 * DAY, until=None)  # read event by event
    todo = remaining({0: 0, 1: 5}, routes, [closed, same, narrower, *routes], DAY, None)
    assert todo == {0: [(0, 10), (20, 30), (60, 100)], 1: [(10, 50)]}
    # a partition the route span does not name starts at 0: nothing below it
    assert remaining({0: 0, 2: 0}, routes, [], None, None) == {0: [(0, 100)]}
    # routed from the log's start: nothing to do
    assert remaining({0: 0}, [route({})], [], None, None) == {}
    # a second route of the topic (another stream) that started earlier bounds it
    assert remaining({0: 0}, [*routes, route({0: 40})], [], None, None) == {0: [(0, 40)]}


@given(
    st.dictionaries(
        st.integers(0, 5),
        st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), min_size=1, max_size=4),
        max_size=6,
    ),
    st.integers(1, 700),
)
def test_chunks_take_every_offset_once(pieces: dict[int, list[tuple[int, int]]], size: int) -> None:
    todo: dict[int, list[tuple[int, int]]] = {}
    for partition, spans in pieces.items():
        ranges, at = [], 0
        for gap, length in spans:
            ranges.append((at + gap, at + gap + length))
            at += gap + length
        todo[partition] = ranges
    wanted = {
        (p, o) for p, ranges in todo.items() for first, end in ranges for o in range(first, end)
    }
    seen: list[tuple[int, int]] = []
    chunks = 0
    while todo:
        chunk = next_chunk(todo, size)
        chunks += 1
        assert chunk and sum(end - first for first, end in chunk.values()) <= size + len(chunk)
        seen += [(p, o) for p, (first, end) in chunk.items() for o in range(first, end)]
        assert chunks < 10_000
    assert sorted(seen) == sorted(wanted)
    assert len(seen) == len(set(seen))


@dataclass
class Record:
    value: bytes
    offset: int


class TrimmedLog:
    """A log whose partitions 1 and 2 lost their first records to retention."""

    def read(self, topic: str, partition: int, offset: int, **_: object) -> list[Record]:
        received = {1: "2026-11-20T04:00:00Z", 2: "2026-11-19T00:00:00.500Z"}[partition]
        return [Record(orjson.dumps({"receivedAt": received}), offset)]


def test_a_window_older_than_the_log_holds_is_refused_saying_what_it_holds() -> None:
    log = TrimmedLog()
    assert held_since(log, "events", {0: 0, 1: 0}) is None  # type: ignore[arg-type]
    held = held_since(log, "events", {0: 0, 1: 1200, 2: 7})  # type: ignore[arg-type]
    assert held is not None
    since = received_ms(b'{"receivedAt": "2026-11-20T04:00:00Z"}')
    assert held == (since, "partitions 1 from offset 1,200, 2 from offset 7")
    for early in (None, since - 1):  # type: ignore[operator]
        plan = BackfillPlan(log_url="x", destination=CRM, since_ms=early)
        with pytest.raises(ConfigError) as refused:
            check_window(plan, held)
        assert str(refused.value) == (
            "the log holds events received since 2026-11-20T04:00:00Z (partitions 1 from offset "
            "1,200, 2 from offset 7); pass --since 2026-11-20T04:00:00Z or later"
        )
    check_window(BackfillPlan(log_url="x", destination=CRM, since_ms=since), held)


def test_until_must_follow_since() -> None:
    with pytest.raises(ConfigError, match="--until must be after --since"):
        BackfillPlan(log_url="x", destination=CRM, since_ms=DAY, until_ms=DAY)


def test_received_and_clock() -> None:
    assert received_ms(b'{"receivedAt": "1970-01-02T00:00:00.250Z"}') == DAY + 250
    assert received_ms(b'{"receivedAt": "1970-01-02T00:00:00"}') == DAY  # no zone: UTC
    assert received_ms(b'{"receivedAt": "yesterday"}') is None
    assert received_ms(b'{"no": 1}') is None
    assert received_ms(b"[1]") is None
    assert received_ms(b"{") is None
    assert [clock(s) for s in (0.4, 12, 105, 7380)] == ["0s", "12s", "1m45s", "2h03m"]
