"""The dedupe job's count of the raw records a micro-batch read, from Spark's progress report:
Spark's input rows where the source reads records, the batch's offsets where it yields ranges."""

from __future__ import annotations

import json

from exactly.dedupe.job import Progress, records_read


def report(rows: int, start: object, end: object) -> dict[str, object]:
    return {
        "batchId": 3,
        "numInputRows": rows,
        "sources": [{"startOffset": start, "endOffset": end, "numInputRows": rows}],
    }


def test_ranges_are_counted_from_the_batchs_offsets() -> None:
    found = report(2, {"0": 10, "1": 4, "tasks": 2}, {"0": 25, "1": 4, "2": 7, "tasks": 2})
    assert records_read(found, ranges=True) == 15 + 0 + 7  # a partition new since: from 0
    assert records_read(found, ranges=False) == 2  # spark-state: Spark's rows are records


def test_positions_as_text_and_a_first_batch_without_a_start() -> None:
    assert records_read(report(1, None, json.dumps({"0": 5, "1": 6})), ranges=True) == 11
    assert records_read(report(0, "{}", "{}"), ranges=True) == 0
    assert records_read(report(0, None, None), ranges=True) == 0
    assert records_read({"batchId": 0, "numInputRows": 0, "sources": []}, ranges=True) == 0


def test_a_runs_progress_adds_its_batches() -> None:
    batches = {
        0: report(2, None, {"0": 5, "1": 5}),
        1: report(2, {"0": 5, "1": 5}, {"0": 9, "1": 5}),
    }
    assert Progress(batches, ranges=True).records == 14
    assert Progress(batches).records == 4
