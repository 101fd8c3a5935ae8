"""The source's Arrow batches: the headers column from flat lists, and batches without it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import ExactlyError
from exactly.log import LogRecord
from exactly.log.column_reads import header_column
from exactly.spark.datasource.options import SourceOptions
from exactly.spark.datasource.source import (
    ARROW_SCHEMA,
    ARROW_SCHEMA_WITHOUT_HEADERS,
    SCHEMA,
    SCHEMA_WITHOUT_HEADERS,
    schema,
    to_arrow,
)

HEADERS = st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3).map(tuple)


@given(st.lists(HEADERS, min_size=1, max_size=20))
def test_the_headers_column_is_what_per_record_dicts_would_give(found: list) -> None:  # type: ignore[type-arg]
    expected = pa.array(
        [[{"key": n, "value": v} for n, v in one] for one in found], ARROW_SCHEMA.field(5).type
    )
    assert header_column(found).equals(expected)


def records() -> list[LogRecord]:
    return [
        LogRecord(0, 7, b"k", b"v", (("exactly.source.offset", b"12"),), 1_700_000_000_123),
        LogRecord(0, 8, None, b"w", (), 1_700_000_000_124),
    ]


def test_a_batch_with_and_without_headers() -> None:
    full = to_arrow(records())
    assert full.schema == ARROW_SCHEMA
    assert full.column("headers").to_pylist() == [
        [{"key": "exactly.source.offset", "value": b"12"}],
        [],
    ]
    bare = to_arrow(records(), headers=False)
    assert bare.schema == ARROW_SCHEMA_WITHOUT_HEADERS
    assert bare.to_pylist() == [
        {k: v for k, v in row.items() if k != "headers"} for row in full.to_pylist()
    ]


def test_the_headers_option() -> None:
    base = {"log": "sqlite:///tmp/x", "topic": "events"}
    assert SourceOptions.parse(base).headers
    assert not SourceOptions.parse({**base, "headers": "false"}).headers
    assert schema(True) == SCHEMA and schema(False) == SCHEMA_WITHOUT_HEADERS
    assert "headers" not in SCHEMA_WITHOUT_HEADERS
    with pytest.raises(ExactlyError, match="headers"):
        SourceOptions.parse({**base, "headers": "maybe"})
