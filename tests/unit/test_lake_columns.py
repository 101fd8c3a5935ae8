"""The lake's columns: promoted columns parsed and checked, rows built from event JSON."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from exactly.errors import ConfigError, LakeError
from exactly.lake.columns import (
    BASE_SCHEMA,
    Promoted,
    conform,
    event_rows,
    lake_schema,
    promoted_column,
    target_schema,
)
from exactly.lake.files import delta_stats


def test_a_promoted_column_names_a_json_column_a_path_and_a_kind() -> None:
    found = promoted_column("page_url", "context.page.url string")
    assert found == Promoted("page_url", "context", ("page", "url"), "string")
    assert found.json_path == "$.page.url"
    assert lake_schema([found]).field("page_url").type == pa.string()


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("revenue", "properties.revenue money"),
        ("revenue", "properties double"),
        ("revenue", "payload.revenue double"),
        ("date", "properties.date string"),
        ("MessageId", "properties.id string"),
        ("bad name", "properties.x string"),
        ("x", "properties.a b double"),
    ],
)
def test_a_bad_promoted_column_says_how_to_write_one(name: str, spec: str) -> None:
    with pytest.raises(ConfigError, match=r"COLUMN\.KEY"):
        promoted_column(name, spec)


def test_event_rows_read_times_as_utc_and_maps_as_json() -> None:
    promoted = [
        promoted_column("revenue", "properties.revenue double"),
        promoted_column("vip", "traits.vip boolean"),
        promoted_column("n", "properties.n bigint"),
    ]
    rows = event_rows(
        [
            b'{"messageId": "a", "type": "track", "userId": 42, '
            b'"timestamp": "2026-03-01T23:30:00+02:00", "properties": {"revenue": "12.5", '
            b'"n": true}, "traits": {"vip": true}}',
            b'{"messageId": "b", "receivedAt": "2026-03-02T01:00:00", "properties": {"revenue":'
            b' "lots"}}',
        ],
        promoted,
    ).to_pylist()
    assert rows[0]["timestamp"] == datetime(2026, 3, 1, 21, 30, tzinfo=UTC)
    assert rows[0]["date"] == date(2026, 3, 1)
    assert rows[0]["userId"] == "42"
    assert (rows[0]["revenue"], rows[0]["vip"], rows[0]["n"]) == (12.5, True, None)
    assert rows[1]["date"] == date(2026, 3, 2)  # receivedAt when there is no timestamp
    assert (rows[1]["revenue"], rows[1]["properties"]) == (None, '{"revenue":"lots"}')


def test_conform_orders_fills_and_refuses_a_changed_kind() -> None:
    promoted = [promoted_column("revenue", "properties.revenue double")]
    batch = event_rows([b'{"messageId": "a"}'])
    conformed = conform(batch, lake_schema(promoted))
    assert conformed.schema == lake_schema(promoted)
    assert conformed.column("revenue").to_pylist() == [None]
    with pytest.raises(LakeError, match="lacks the columns"):
        conform(batch.drop_columns(["date"]), None)
    text = event_rows([b'{"messageId": "a"}'], [promoted_column("revenue", "properties.r string")])
    with pytest.raises(LakeError, match="cannot change"):
        conform(text, lake_schema(promoted))
    assert conform(batch, None).schema == BASE_SCHEMA


def test_the_target_schema_is_the_tables_then_the_batchs_new_columns() -> None:
    revenue = [promoted_column("revenue", "properties.revenue double")]
    plan = [promoted_column("plan", "traits.plan string")]
    table = pa.schema([*lake_schema(revenue)]).with_metadata({"kept": "no"})
    target = target_schema(lake_schema(plan), table)
    assert target.names == [*BASE_SCHEMA.names, "revenue", "plan"]
    assert target.metadata is None and target_schema(lake_schema(), None) == BASE_SCHEMA
    with pytest.raises(LakeError, match="cannot change"):
        target_schema(lake_schema([promoted_column("revenue", "traits.r bigint")]), table)


def test_delta_stats_bound_the_values_to_the_millisecond() -> None:
    rows = event_rows(
        [
            b'{"messageId": "b", "timestamp": "2026-01-01T10:00:00.123456Z"}',
            b'{"messageId": "a", "timestamp": "2026-01-01T10:00:00.100000Z"}',
            b'{"messageId": "c"}',
        ]
    )
    stats = json.loads(delta_stats(rows))
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"messageId": "a", "timestamp": "2026-01-01T10:00:00.100Z"}
    assert stats["maxValues"] == {"messageId": "c", "timestamp": "2026-01-01T10:00:00.124Z"}
    assert stats["nullCount"] == {
        "messageId": 0,
        "timestamp": 1,
        "originalTimestamp": 3,
        "sentAt": 3,
        "receivedAt": 3,
    }
