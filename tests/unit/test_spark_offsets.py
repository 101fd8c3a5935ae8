"""The source's offset rules: option parsing, starting positions, the rate limit, AvailableNow."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import ConfigError, StreamError
from exactly.spark.datasource import offsets
from exactly.spark.datasource.options import SinkOptions, SourceOptions


def test_parse_spec() -> None:
    assert offsets.parse_spec("s", "earliest") == "earliest"
    assert offsets.parse_spec("s", " LATEST ") == "latest"
    assert offsets.parse_spec("s", '{"0": 5, "2": -2}') == {0: 5, 2: -2}
    for bad in ["soon", "[1]", '{"a": 1}', '{"0": -3}', '{"-1": 0}']:
        with pytest.raises(ConfigError):
            offsets.parse_spec("s", bad)
    with pytest.raises(ConfigError, match="latest"):
        offsets.parse_spec("endingOffsets", "earliest", allow_earliest=False)


def test_resolve() -> None:
    ends = {0: 10, 1: 20, 2: 0}
    assert offsets.resolve("s", "earliest", ends) == {0: 0, 1: 0, 2: 0}
    assert offsets.resolve("s", "latest", ends) == ends
    assert offsets.resolve("s", {0: 4, 1: -1}, ends) == {0: 4, 1: 20, 2: 0}
    assert offsets.resolve("e", {0: 4}, ends, offsets.LATEST) == {0: 4, 1: 20, 2: 0}
    with pytest.raises(ConfigError, match="past its end"):
        offsets.resolve("s", {0: 11}, ends)
    with pytest.raises(ConfigError, match="partitions 0 to 2"):
        offsets.resolve("s", {3: 0}, ends)


def test_json_round_trip() -> None:
    assert offsets.to_json({1: 5, 0: 3}) == {"0": 3, "1": 5}
    assert list(offsets.to_json({1: 5, 0: 3})) == ["0", "1"]
    assert offsets.from_json({"0": 3, "1": 5}) == {0: 3, 1: 5}
    with pytest.raises(StreamError):
        offsets.from_json({"x": 1})


def test_advance_refuses_a_topic_that_went_backwards() -> None:
    assert offsets.advance({0: 3}, {0: 5, 1: 2}) == {0: 5, 1: 2}  # a new partition from 0
    with pytest.raises(StreamError, match="recreated"):
        offsets.advance({0: 9}, {0: 5})


def test_cap_examples() -> None:
    assert offsets.cap({0: 0, 1: 0}, {0: 10, 1: 10}, 100) == {0: 10, 1: 10}
    assert offsets.cap({0: 0, 1: 0}, {0: 10, 1: 10}, 6) == {0: 3, 1: 3}
    assert offsets.cap({0: 0, 1: 0}, {0: 1, 1: 10}, 6) == {0: 1, 1: 5}  # the unused share moves
    assert offsets.cap({0: 0, 1: 0, 2: 0}, {0: 9, 1: 9, 2: 9}, 2) == {0: 0, 1: 1, 2: 1}
    with pytest.raises(ConfigError):
        offsets.cap({0: 0}, {0: 1}, 0)


positions = st.dictionaries(
    st.integers(0, 7), st.tuples(st.integers(0, 1000), st.integers(0, 1000)), min_size=1
)


@given(positions, st.integers(1, 3000))
def test_cap_properties(ranges: dict[int, tuple[int, int]], limit: int) -> None:
    start = {p: min(a, b) for p, (a, b) in ranges.items()}
    end = {p: max(a, b) for p, (a, b) in ranges.items()}
    capped = offsets.cap(start, end, limit)
    available = sum(end[p] - start[p] for p in end)
    taken = sum(capped[p] - start[p] for p in end)
    assert all(start[p] <= capped[p] <= end[p] for p in end)
    assert taken == min(limit, available)  # never more than the limit, never less than it can
    assert offsets.cap(start, end, limit) == capped  # deterministic
    shares = [capped[p] - start[p] for p in end if capped[p] < end[p]]
    assert not shares or max(shares) - min(shares) <= 1  # fair among the partitions it limits


def test_limit_to_available_now_target() -> None:
    start = {0: 2, 1: 0}
    assert offsets.limit_to(start, {0: 10, 1: 10}, None) == {0: 10, 1: 10}
    assert offsets.limit_to(start, {0: 10, 1: 10}, {0: 5, 1: 20}) == {0: 5, 1: 10}
    assert offsets.limit_to(start, {0: 10, 1: 10, 2: 4}, {0: 1, 1: 3}) == {0: 2, 1: 3, 2: 0}


def test_source_options() -> None:
    parsed = SourceOptions.parse(
        {"log": "sqlite:///x", "topic": "t", "maxRecordsPerTrigger": "10", "arrow": "false"}
    )
    assert (parsed.max_records_per_trigger, parsed.arrow, parsed.starting) == (
        10,
        False,
        "earliest",
    )
    with pytest.raises(ConfigError, match='option\\("log"'):
        SourceOptions.parse({"topic": "t"})
    with pytest.raises(ConfigError, match="maxRecordsPerTrigger"):
        SourceOptions.parse({"log": "sqlite:///x", "topic": "t", "maxRecordsPerTrigger": "0"})


def test_sink_options() -> None:
    parsed = SinkOptions.parse(
        {
            "log": "sqlite:///x",
            "topic": "t",
            "checkpointLocation": "/c",
            "guarantee": "AT-LEAST-ONCE",
        }
    )
    assert (parsed.checkpoint, parsed.guarantee, parsed.sink_id) == ("/c", "at-least-once", None)
    with pytest.raises(ConfigError, match="guarantee"):
        SinkOptions.parse({"log": "sqlite:///x", "topic": "t", "guarantee": "maybe"})


def test_a_position_records_its_read_tasks() -> None:
    position = offsets.to_json({1: 7, 0: 3}, tasks=2)
    assert list(position) == ["0", "1", "tasks"]
    assert offsets.from_json(position) == {0: 3, 1: 7}
    assert offsets.tasks_of(position) == 2
    assert offsets.tasks_of(offsets.to_json({0: 3})) is None  # a checkpoint from before
    for bad in (0, "2", True):
        with pytest.raises(StreamError):
            offsets.tasks_of({"0": 3, "tasks": bad})


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=12),
    st.one_of(st.none(), st.integers(1, 16)),
)
def test_read_tasks_keep_each_range_whole_and_in_order(sizes: list[int], tasks: int | None) -> None:
    from exactly.spark.datasource.source import OffsetRange, ReadTask, ranges, read_tasks

    end = {partition: size for partition, size in enumerate(sizes)}
    found = ranges({}, end)
    planned = read_tasks(found, tasks)
    assert planned == read_tasks(found, tasks)  # deterministic: a replay reads alike
    flat = [r for task in planned for r in (task.ranges if isinstance(task, ReadTask) else [task])]
    assert flat == found and all(isinstance(r, OffsetRange) for r in flat)
    assert len(planned) == (len(found) if tasks is None else min(tasks, len(found)))
    if planned and tasks is not None and tasks < len(found):
        lengths = [len(task.ranges) for task in planned if isinstance(task, ReadTask)]
        assert max(lengths) - min(lengths) <= 1
