"""``streaming.ProgressReader``: each progress report Spark keeps is read once, in order, however
many arrive between two polls and however many Spark has dropped from its list meanwhile."""

from __future__ import annotations

import json
from typing import Any

from exactly.spark.streaming import ProgressReader

QUERY_ID = "6f1c3b2e-0000-4000-8000-000000000001"


class Kept:
    """One report as py4j hands it over: an object whose ``json()`` is the report's JSON."""

    def __init__(self, report: dict[str, Any]) -> None:
        self.text = json.dumps(report)

    def json(self) -> str:
        return self.text


class Query:
    """The part of a StreamingQuery ``ProgressReader`` reads: ``_jsq.recentProgress()``, a list
    Spark keeps at most ``keep`` of, oldest first."""

    def __init__(self, keep: int = 100) -> None:
        self.keep = keep
        self.reports: list[Kept] = []
        self._jsq = self

    def recentProgress(self) -> list[Kept]:  # Spark's name
        return list(self.reports)

    def add(self, batch: int, at: int) -> None:
        report = {
            "id": QUERY_ID,
            "runId": QUERY_ID,
            "name": None,
            "timestamp": f"2026-11-30T12:00:{at:02d}.000Z",
            "batchId": batch,
            "batchDuration": 10,
            "numInputRows": at,
            "stateOperators": [],
            "sources": [],
            "sink": {"description": "sink", "numOutputRows": -1},
        }
        self.reports = [*self.reports, Kept(report)][-self.keep :]


def seen(reports: list[Any]) -> list[tuple[int, int]]:
    return [(report["batchId"], report["numInputRows"]) for report in reports]


def test_each_report_once_in_order() -> None:
    query = Query()
    progress = ProgressReader(query)
    assert progress.new_reports() == []
    query.add(0, 1)
    query.add(1, 2)
    assert seen(progress.new_reports()) == [(0, 1), (1, 2)]
    assert progress.new_reports() == []  # nothing new: nothing again
    query.add(1, 3)  # a report without data names the batch it waits for again
    query.add(2, 4)
    assert seen(progress.new_reports()) == [(1, 3), (2, 4)]
    assert progress.new_reports() == []
    query.add(3, 5)
    [report] = progress.new_reports()
    assert report["batchId"] == 3 and str(report["id"]) == QUERY_ID  # Spark's own report type


def test_reports_spark_dropped_meanwhile_are_not_asked_for_again() -> None:
    query = Query(keep=3)
    progress = ProgressReader(query)
    query.add(0, 1)
    assert seen(progress.new_reports()) == [(0, 1)]
    for batch in range(1, 6):  # five more: the one read last has left Spark's list of three
        query.add(batch, batch + 1)
    assert seen(progress.new_reports()) == [(3, 4), (4, 5), (5, 6)]
    query.add(6, 7)
    assert seen(progress.new_reports()) == [(6, 7)]
