"""Records in Arrow columns (``exactly.log.columns``): the same records, checks and bytes."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import InvalidRecord, RecordTooLarge
from exactly.log import Log, Record
from exactly.log.base import records_of
from exactly.log.column_reads import of_records
from exactly.log.columns import HEADERS, check, record_columns, with_header, without_header
from exactly.log.sqlite_format import (
    BATCH_BYTES,
    PackedBatch,
    decode_columns,
    decode_records,
    pack,
    pack_columns,
)

names = st.sampled_from(["a", "b", "", "é\x00", "exactly.seq"])
headers = st.lists(st.tuples(names, st.binary(max_size=8)), max_size=3).map(tuple)
records = st.builds(
    Record,
    value=st.binary(max_size=40),
    key=st.none() | st.binary(max_size=10),
    headers=headers,
    timestamp=st.none() | st.integers(-(2**63), 2**63 - 1),
)


def in_columns(found: list[Record]) -> pa.RecordBatch:
    return record_columns(
        pa.array([r.value for r in found], pa.binary()),
        pa.array([r.key for r in found], pa.binary()),
        pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in found], HEADERS),
        pa.array([r.timestamp for r in found], pa.int64()),
    )


@given(st.lists(records, max_size=30), st.integers(0, 2**40), st.data())
def test_columns_pack_byte_for_byte_as_their_records(
    found: list[Record], stamp: int, data: st.DataObject
) -> None:
    columns = in_columns(found)
    assert records_of(columns) == found
    assert pack_columns(columns, stamp) == pack(found, stamp)
    start = data.draw(st.integers(0, len(found)))
    length = data.draw(st.integers(0, len(found) - start))
    part = columns.slice(start, length)
    assert records_of(part) == found[start : start + length]
    assert pack_columns(part, stamp) == pack(found[start : start + length], stamp)


@given(st.lists(records, max_size=30), st.integers(0, 2**40), st.booleans(), st.data())
def test_a_stored_batch_decodes_to_the_columns_of_its_records(
    found: list[Record], offset: int, headers: bool, data: st.DataObject
) -> None:
    """``decode_columns`` answers what ``decode_records`` does, in columns: keys null or not,
    empty values, headers asked or not, from any record on, any count."""
    (batch,) = pack(found, 7) or [PackedBatch(0, b"", None)]
    skip = data.draw(st.integers(0, len(found)))
    count = data.draw(st.integers(0, len(found) + 2))
    expected, content = decode_records(batch.data, 0, offset, skip, count, headers)
    read, contents = decode_columns(batch.data, offset, skip, count, headers)
    assert read.equals(of_records(expected, headers))
    assert int(contents.sum()) == content


def test_large_records_are_cut_into_the_same_batches() -> None:
    found = [Record(b"v" * (BATCH_BYTES // 3), b"k%d" % n, (("h", b"1"),)) for n in range(10)]
    packed = pack_columns(in_columns(found), 5)
    assert packed == pack(found, 5)
    assert len(packed) > 2


@given(st.lists(headers, min_size=1, max_size=20), st.data())
def test_a_header_is_replaced_and_put_last(lists: list[tuple], data: st.DataObject) -> None:
    column = pa.array(
        [[{"key": k, "value": v} for k, v in found] for found in lists], HEADERS
    ).slice(data.draw(st.integers(0, len(lists) - 1)))
    marks = pa.array([b"m%d" % n for n in range(len(column))], pa.binary())
    wanted = [[h for h in found or [] if h["key"] != "a"] for found in column.to_pylist()]
    assert [found or [] for found in without_header(column, "a").to_pylist()] == wanted
    marked = with_header(column, "a", marks).to_pylist()
    assert marked == [
        [*found, {"key": "a", "value": mark}]
        for found, mark in zip(wanted, marks.to_pylist(), strict=True)
    ]


def test_null_header_lists_are_no_headers() -> None:
    column = pa.array([None, [{"key": "b", "value": b"1"}], None], HEADERS)
    marked = with_header(column, "a", pa.array([b"x", b"y", b"z"]))
    assert marked.to_pylist() == [
        [{"key": "a", "value": b"x"}],
        [{"key": "b", "value": b"1"}, {"key": "a", "value": b"y"}],
        [{"key": "a", "value": b"z"}],
    ]


def test_check_refuses_what_an_append_refuses_naming_the_record() -> None:
    fine = [Record(b"v" * 10, b"k", (("h", b"12"),)), Record(b"w", None)]
    check(in_columns(fine), 14)  # 10 + 1 + 1 + 2: at the limit
    with pytest.raises(RecordTooLarge, match="record 0 is 14 bytes"):
        check(in_columns(fine), 13)
    reserved = [*fine, Record(b"x", None, (("exactly.seq", b"1"),))]
    with pytest.raises(InvalidRecord, match="record 2: header names"):
        check(in_columns(reserved), 100)
    names = ["value", "key", "headers", "timestamp"]
    nulls = pa.RecordBatch.from_arrays(
        [pa.array([b"a", None]), *in_columns(fine).columns[1:]], names=names
    )
    with pytest.raises(InvalidRecord, match="record 1: the value must be bytes"):
        check(nulls, 100)


@given(st.lists(records, min_size=1, max_size=10), st.integers(0, 120))
def test_check_refuses_exactly_what_an_append_refuses(found: list[Record], limit: int) -> None:
    log = SimpleNamespace(max_record_bytes=limit)
    try:
        Log._check_records(log, found)  # type: ignore[arg-type]
    except (InvalidRecord, RecordTooLarge) as error:
        with pytest.raises(type(error), match=re.escape(str(error))):
            check(in_columns(found), limit)
    else:
        check(in_columns(found), limit)
