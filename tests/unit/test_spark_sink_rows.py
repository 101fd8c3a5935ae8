"""How the sink turns an Arrow batch into rows per output partition (``sink._grouped``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import StreamError
from exactly.events import partition_for
from exactly.log import Record, open_log
from exactly.log.base import records_of
from exactly.spark.datasource.marks import MARK, Mark
from exactly.spark.datasource.sink import Columns, PartitionOutput, _grouped, _in_columns

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
ALL = Columns(key=True, partition=True, headers=True, timestamp=True)


def batch(
    values: list[bytes | str | None],
    *,
    keys: list[bytes | None] | None = None,
    partitions: list[int | None] | None = None,
    headers: list[list[tuple[str, bytes]] | None] | None = None,
    text: bool = False,
) -> pa.RecordBatch:
    count = len(values)
    stamps = [1_700_000_000_123_000 + n * 1000 for n in range(count)]
    listed = [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers or []]
    return pa.RecordBatch.from_pydict(
        {
            "partition": pa.array(partitions or [0] * count, pa.int32()),
            "key": pa.array(keys or [None] * count, pa.binary()),
            "value": pa.array(values, pa.string() if text else pa.binary()),
            "timestamp": pa.array(stamps, pa.timestamp("us", tz="UTC")),
            "headers": pa.array(listed or [[]] * count, pa.list_(HEADER)),
        }
    )


def test_one_partition_with_one_header_each_keeps_order_and_fields() -> None:
    found = _grouped(
        batch([b"a", b"b"], keys=[b"k1", None], headers=[[("h", b"1")], [("h", b"2")]]),
        ALL,
        4,
    )
    assert found == {
        0: [
            (b"a", b"k1", (("h", b"1"),), 1_700_000_000_123),
            (b"b", None, (("h", b"2"),), 1_700_000_000_124),
        ]
    }


def test_rows_spread_over_partitions_keep_their_order_in_each() -> None:
    values = [b"%d" % n for n in range(6)]
    found = _grouped(batch(values, partitions=[1, 0, 1, 2, 0, 1]), ALL, 3)
    assert {p: [row[0] for row in rows] for p, rows in found.items()} == {
        1: [b"0", b"2", b"5"],
        0: [b"1", b"4"],
        2: [b"3"],
    }


def test_a_missing_partition_is_the_key_hash_and_without_a_key_the_value_hash() -> None:
    found = _grouped(batch([b"v1", b"v2"], keys=[b"k1", None], partitions=[None, None]), ALL, 8)
    expected: dict[int, list[bytes]] = {}
    for key in (b"k1", b"v2"):
        expected.setdefault(partition_for(key, 8), []).append(key)
    assert {p: [row[1] or row[0] for row in rows] for p, rows in found.items()} == expected


def test_marks_are_dropped_and_other_headers_kept_whatever_their_number() -> None:
    headers = [
        [("a", b"1"), (MARK, b"s 1 2 3"), ("b", b"2")],
        [],
        None,
        [(MARK, b"s 1 2 4")],
        [("c", b"3")],
    ]
    found = _grouped(batch([b"v"] * 5, headers=headers), ALL, 1)
    assert [row[2] for row in found[0]] == [
        (("a", b"1"), ("b", b"2")),
        (),
        (),
        (),
        (("c", b"3"),),
    ]


def test_a_mark_as_the_only_header_of_every_row_is_dropped() -> None:
    found = _grouped(batch([b"v"] * 2, headers=[[(MARK, b"x")], [(MARK, b"y")]]), ALL, 1)
    assert [row[2] for row in found[0]] == [(), ()]


def test_a_sliced_batch_reads_its_own_rows_only() -> None:
    whole = batch([b"a", b"b", b"c"], headers=[[("h", b"1")], [("h", b"2")], [("h", b"3")]])
    found = _grouped(whole.slice(1, 2), ALL, 1)
    assert [(row[0], row[2]) for row in found[0]] == [
        (b"b", (("h", b"2"),)),
        (b"c", (("h", b"3"),)),
    ]


def test_text_values_become_bytes() -> None:
    assert _grouped(batch(["é"], text=True), ALL, 1)[0][0][0] == "é".encode()


def test_a_null_value_or_a_partition_out_of_range_is_refused() -> None:
    with pytest.raises(StreamError, match="value is null"):
        _grouped(batch([b"a", None]), ALL, 1)
    with pytest.raises(
        StreamError, match="partition column is 3, but the topic has partitions 0 to 2"
    ):
        _grouped(batch([b"a", b"b"], partitions=[3, 3]), ALL, 3)
    with pytest.raises(StreamError, match="partition column is -1"):
        _grouped(batch([b"a", b"b"], partitions=[0, -1]), ALL, 3)


def test_columns_left_out_give_none_and_no_headers() -> None:
    plain = Columns(key=False, partition=False, headers=False, timestamp=False)
    found = _grouped(batch([b"a"]), plain, 1)
    assert found == {0: [(b"a", None, (), None)]}


header_lists = st.lists(
    st.tuples(st.sampled_from(["h", MARK, "x"]), st.binary(max_size=4)), max_size=3
)


@given(
    st.lists(
        st.tuples(
            st.binary(max_size=6),
            st.none() | st.binary(max_size=4),
            st.integers(0, 2),
            st.none() | header_lists,
        ),
        min_size=1,
        max_size=25,
    ),
    st.booleans(),
    st.integers(0, 3),
)
def test_the_columns_hold_the_same_records_as_the_rows(
    rows: list[tuple[bytes, bytes | None, int, list[tuple[str, bytes]] | None]],
    text: bool,
    start: int,
) -> None:
    found = batch(
        [value.hex() if text else value for value, *_ in rows],
        keys=[key for _, key, _, _ in rows],
        partitions=[partition for _, _, partition, _ in rows],
        headers=[headers for *_, headers in rows],
        text=text,
    ).slice(min(start, len(rows) - 1))
    parts = _in_columns(found, ALL, 3)
    assert parts is not None
    merged: dict[int, list[Record]] = {}
    for partition, columns in parts:
        merged.setdefault(partition, []).extend(records_of(columns))
    assert merged == _grouped(found, ALL, 3)


def test_rows_the_columns_cannot_take_go_to_the_rows() -> None:
    assert _in_columns(batch([b"a"], partitions=[None]), ALL, 1) is None  # the key's hash
    plain = Columns(key=False, partition=False, headers=False, timestamp=False)
    assert _in_columns(batch([b"a"]), plain, 1) is None
    with pytest.raises(StreamError, match="partition column is 3"):
        _in_columns(batch([b"a", b"b"], partitions=[3, 3]), ALL, 3)


def test_a_partition_output_appends_columns_as_it_appends_rows(tmp_path: Path) -> None:
    found = batch(
        [b"v%d" % n for n in range(30)],
        keys=[b"k%d" % n for n in range(30)],
        headers=[[("h", b"%d" % n), (MARK, b"old")] for n in range(30)],
    )
    written = {}
    with open_log(f"sqlite://{tmp_path / 'log'}") as log:
        for way in ("rows", "columns"):
            log.create_topic(way, 1)
            for skipped in (0, 7):  # the second attempt resumes after 7 stored records
                output = PartitionOutput(log, way, 0, Mark("s", skipped, 0, 0), 0, 4)
                output.skipped = skipped
                for at in range(0, 30, 11):
                    part = found.slice(at, 11)
                    if way == "rows":
                        output.add(_grouped(part, ALL, 1)[0])
                    else:
                        output.add_columns(_in_columns(part, ALL, 1)[0][1])
                output.finish()
                output.close()
            written[way] = [
                (r.key, r.value, r.headers, r.timestamp)
                for r in log.read(way, 0, 0, max_records=100)
            ]
    assert written["rows"] == written["columns"]
    assert len(written["rows"]) == 30 + 23
