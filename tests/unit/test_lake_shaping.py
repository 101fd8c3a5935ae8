"""A Spark task's part of a segment batch, through its rows and back (no Spark: the task function
is called as ``mapInArrow`` calls it)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from exactly.lake.segment import Limits
from exactly.lake.segment.parts import shape_part
from exactly.lake.segment.table import Columns
from exactly.lake.shaping import PartJob, parts_of, shape_task
from tests.warehouse_events import sdk_events

LOADED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def records(events: list[dict[str, object]], size: int) -> list[pa.RecordBatch]:
    values = [orjson.dumps(e).decode() for e in events]
    return [
        pa.RecordBatch.from_pydict({"value": values[at : at + size]})
        for at in range(0, len(values), size)
    ]


def test_a_task_part_survives_its_trip_to_the_driver() -> None:
    events = sdk_events(0, 90)
    job = PartJob({}, LOADED, Limits(), can_widen=False)
    rows = pa.Table.from_batches(list(shape_task(job, iter(records(events, 25)))))
    [part] = parts_of(rows)
    assert part == shape_part(events, {}, loaded_at=LOADED, limits=Limits(), can_widen=False)


def test_a_retyping_task_sends_rows_only_and_an_empty_task_nothing() -> None:
    events = sdk_events(0, 40)
    whole = shape_part(events, {}, loaded_at=LOADED, limits=Limits(), can_widen=False)
    kinds = whole.tables["tracks"].kinds
    decided = {"tracks": Columns(kinds, kinds, {})}
    job = PartJob({}, LOADED, Limits(), can_widen=False, decided=decided)
    [part] = parts_of(pa.Table.from_batches(list(shape_task(job, iter(records(events, 7))))))
    assert list(part.tables) == ["tracks"] and not part.tallies and not part.profiles
    assert part.tables["tracks"].rows.equals(whole.tables["tracks"].rows)
    assert list(shape_task(job, iter(records([], 7)))) == []
