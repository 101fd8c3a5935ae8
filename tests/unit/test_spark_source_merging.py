"""Option ``merge``: which records the source merges into one weighted row, and that row."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pyarrow as pa
import pytest

from exactly.errors import ConfigError
from exactly.events.fields import Field, Fields
from exactly.log import LogRecord
from exactly.spark.datasource.merging import WEIGHT, merged
from exactly.spark.datasource.options import SourceOptions
from exactly.spark.datasource.source import schema, to_arrow

FIELDS = Fields(
    (
        Field("type", "string"),
        Field("event", "string"),
        Field("timestamp", "timestamp"),
        Field("receivedAt", "timestamp"),
        Field("properties", "map", ("revenue",)),
    )
)
TIMES = ("timestamp", "receivedAt")
LOGGED = 1_795_000_000_000  # 2026-11-18T11:06:40Z, the records' own time (ms)


def batch(*events: dict[str, object] | bytes, logged: int = LOGGED) -> pa.RecordBatch:
    values = [e if isinstance(e, bytes) else orjson.dumps(e) for e in events]
    found = [LogRecord(0, n, None, v, (), logged) for n, v in enumerate(values)]
    return to_arrow(found, headers=False, fields=FIELDS)


def rows(found: list[pa.RecordBatch]) -> list[dict[str, object]]:
    return [row for one in found for row in one.to_pylist()]


def track(event: str, at: str, **more: object) -> dict[str, object]:
    return {"type": "track", "event": event, "timestamp": at, **more}


def test_alike_records_in_one_minute_become_one_row_weighing_them() -> None:
    found = rows(
        list(
            merged(
                batch(
                    track("Bought", "2026-11-26T06:00:01Z"),
                    track("Bought", "2026-11-26T06:00:59.999Z"),
                    track("Bought", "2026-11-26T06:01:00Z"),
                    track("Viewed", "2026-11-26T06:00:30Z"),
                    track("", "2026-11-26T06:00:30Z"),
                    {"type": "track", "timestamp": "2026-11-26T06:00:30Z"},  # event null, not ''
                    track("Bought", "2026-11-26T06:00:02Z", properties={"other": 1}),
                ),
                FIELDS,
                TIMES,
            )
        )
    )
    minute = datetime(2026, 11, 26, 6, 0, tzinfo=UTC)
    by_event = {
        (r["fields"]["event"], r["fields"]["timestamp"]): r[WEIGHT]
        for r in found  # type: ignore[index]
    }
    assert by_event == {
        ("Bought", minute): 3,  # a map without the keys read is as good as none
        ("Bought", minute.replace(minute=1)): 1,
        ("Viewed", minute): 1,
        ("", minute): 1,
        (None, minute): 1,
    }
    first = next(r for r in found if r[WEIGHT] == 3)
    assert first["offset"] == 0 and first["timestamp"] == minute
    assert first["value"] is None and first["key"] is None
    assert first["fields"]["receivedAt"] is None and first["fields"]["properties"] is None  # type: ignore[index]


def test_records_that_do_not_merge_stay_whole_with_weight_one() -> None:
    found = rows(
        list(
            merged(
                batch(
                    track("Bought", "2026-11-26T06:00:01Z", properties={"revenue": "5"}),
                    track("Bought", "2026-11-26T06:00:01Z", properties={"revenue": 5}),
                    track("Bought", "2026-11-26T06:00:01Z", properties={"revenue": 5e10}),  # JVM
                    track("Bought", "1969-12-31T23:59:00Z"),
                    b"not json",
                ),
                FIELDS,
                TIMES,
            )
        )
    )
    assert [r[WEIGHT] for r in found] == [1, 1, 1, 1, 1]
    assert [r["offset"] for r in found] == [0, 1, 2, 3, 4]
    # a numeric revenue is read as Spark's text of it; one whose text is not known goes to Spark
    assert found[1]["fields"]["properties"] == [("revenue", "5")]  # type: ignore[index]
    assert found[2]["value"] is not None and found[2]["fields"] is None


def test_the_time_is_the_first_time_field_then_the_records_own() -> None:
    found = rows(
        list(
            merged(
                batch(
                    {"type": "page", "receivedAt": "2026-11-26T06:00:10Z"},
                    {"type": "page", "timestamp": "2026-11-26T06:00:20Z"},
                    {"type": "page"},
                ),
                FIELDS,
                TIMES,
            )
        )
    )
    assert sorted((r["timestamp"], r[WEIGHT]) for r in found) == [
        (datetime(2026, 11, 18, 11, 6, tzinfo=UTC), 1),
        (datetime(2026, 11, 26, 6, 0, tzinfo=UTC), 2),
    ]


def test_the_merge_option() -> None:
    base = {"log": "sqlite:///tmp/x", "topic": "events", "fields": FIELDS.option}
    assert SourceOptions.parse({**base, "merge": "timestamp,receivedAt"}).merge == TIMES
    assert schema(False, FIELDS, merge=True).endswith(", weight bigint")
    for wrong in ({**base, "merge": "type"}, {**base, "merge": "timestamp", "keepValues": "true"}):
        with pytest.raises(ConfigError, match="option merge"):
            SourceOptions.parse(wrong)
