"""Offset arithmetic of the source: pure functions, so the rules are tested without Spark.

Spark keeps a source position as JSON; ours is ``{"<partition>": next offset, ...}`` with every
partition of the topic, in partition order, and, when the query groups partitions into fewer read
tasks, ``"tasks": n``: how many tasks read the micro-batch that ends there. Spark records a batch's
end before running it, so a replayed batch is read by the same tasks, each with the same ranges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from exactly.errors import ConfigError, StreamError

Offsets = dict[int, int]
Spec = Literal["earliest", "latest"] | Offsets

EARLIEST = -2  # in a JSON spec, as in Spark's Kafka source
LATEST = -1
TASKS = "tasks"  # the one key of a position that is not a partition


def to_json(offsets: Mapping[int, int], tasks: int | None = None) -> dict[str, int]:
    """The form Spark stores: string keys, partition order, then ``tasks`` if given."""
    position = {str(partition): offsets[partition] for partition in sorted(offsets)}
    if tasks is not None:
        position[TASKS] = tasks
    return position


def from_json(offsets: Mapping[str, Any]) -> Offsets:
    """Offsets back from Spark's JSON form (without ``tasks``)."""
    try:
        return {
            int(partition): int(offset)
            for partition, offset in offsets.items()
            if partition != TASKS
        }
    except (TypeError, ValueError) as error:
        raise StreamError(f"not a source position of the exactly source: {offsets!r}") from error


def tasks_of(position: Mapping[str, Any]) -> int | None:
    """How many read tasks the batch ending at ``position`` has; None: one per partition."""
    tasks = position.get(TASKS)
    if tasks is None:
        return None
    if not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1:
        raise StreamError(f"not a source position of the exactly source: {position!r}")
    return tasks


def parse_spec(name: str, text: str, *, allow_earliest: bool = True) -> Spec:
    """An offsets option: ``earliest``, ``latest`` or JSON ``{"0": 12, "1": -2}``.

    In JSON, -2 means the partition's earliest offset and -1 its latest.
    """
    text = text.strip()
    if text.lower() == "latest":
        return "latest"
    if text.lower() == "earliest" and allow_earliest:
        return "earliest"
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        spec = {int(partition): int(offset) for partition, offset in data.items()}
    except (TypeError, ValueError):
        choices = "earliest, latest" if allow_earliest else "latest"
        raise ConfigError(
            f'option {name} is {text!r}: use {choices} or JSON such as {{"0": 10, "1": -2}} '
            "(partition to offset; -2 earliest, -1 latest)"
        ) from None
    bad = [p for p, o in spec.items() if p < 0 or o < EARLIEST]
    if bad:
        raise ConfigError(f"option {name}: partition {bad[0]} has an invalid entry")
    return spec


def resolve(name: str, spec: Spec, ends: Mapping[int, int], missing: int = EARLIEST) -> Offsets:
    """Concrete offsets for every partition of a topic whose partitions end at ``ends``.

    Partitions a JSON spec leaves out get ``missing`` (earliest for a start, latest for an end);
    an offset past a partition's end, or a partition the topic does not have, is an error.
    """
    if spec == "earliest":
        return dict.fromkeys(ends, 0)
    if spec == "latest":
        return dict(ends)
    unknown = sorted(set(spec) - set(ends))
    if unknown:
        raise ConfigError(
            f"option {name} names partition {unknown[0]}, but the topic has partitions "
            f"0 to {len(ends) - 1}"
        )
    resolved: Offsets = {}
    for partition, end in ends.items():
        wanted = spec.get(partition, missing)
        offset = 0 if wanted == EARLIEST else end if wanted == LATEST else wanted
        if offset > end:
            raise ConfigError(
                f"option {name} starts partition {partition} at {offset}, past its end {end}"
            )
        resolved[partition] = offset
    return resolved


def advance(start: Mapping[int, int], ends: Mapping[int, int]) -> Offsets:
    """The end of the next batch with no limit: every partition to its end.

    Partitions new since ``start`` start at 0. A partition that ends before ``start`` means the
    topic was replaced under the checkpoint: continuing would skip or repeat records.
    """
    for partition, offset in start.items():
        if partition in ends and ends[partition] < offset:
            raise StreamError(
                f"partition {partition} ends at offset {ends[partition]}, before {offset} where "
                "this query's checkpoint says it stopped: was the topic deleted and recreated? "
                "start the query with a new checkpoint"
            )
    return {partition: max(end, start.get(partition, 0)) for partition, end in ends.items()}


def cap(start: Mapping[int, int], end: Mapping[int, int], max_records: int) -> Offsets:
    """Move from ``start`` towards ``end`` by at most ``max_records`` offsets in total.

    Fair: each partition gets an equal share of the budget, and what a partition with fewer
    records cannot use goes to the others (water-filling). Deterministic, and it always advances
    when there is anything to read and ``max_records`` is positive.
    """
    if max_records < 1:
        raise ConfigError(f"maxRecordsPerTrigger must be positive, not {max_records}")
    available = {p: max(0, end[p] - start.get(p, 0)) for p in end}
    if sum(available.values()) <= max_records:
        return dict(end)
    take = dict.fromkeys(available, 0)
    budget, left = max_records, len(available)
    # smallest first: the last partition, the largest, takes whatever budget is left
    for partition in sorted(available, key=lambda p: (available[p], p)):
        share = min(available[partition], budget // left)
        take[partition] = share
        budget -= share
        left -= 1
    return {p: start.get(p, 0) + take[p] for p in end}


def limit_to(
    start: Mapping[int, int], end: Mapping[int, int], target: Mapping[int, int] | None
) -> Offsets:
    """``end`` no further than ``target`` (what Trigger.AvailableNow found), never behind ``start``.

    A partition that appeared after the target was taken has nothing to read in this run.
    """
    if target is None:
        return dict(end)
    return {p: max(start.get(p, 0), min(offset, target.get(p, 0))) for p, offset in end.items()}
