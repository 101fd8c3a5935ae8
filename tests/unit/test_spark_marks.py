"""The sink's record marks and resume rule, and how errors come back from Spark."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from exactly.errors import StreamError, TopicOwned
from exactly.spark.datasource.marks import MARK, Mark, find_mark, resume_at, without_mark
from exactly.spark.datasource.sink import Columns
from exactly.spark.streaming import from_spark


@given(
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    st.integers(0, 2**40),
    st.integers(0, 10_000),
    st.integers(0, 2**40),
)
def test_mark_round_trip(sink: str, batch: int, task: int, sequence: int) -> None:
    mark = Mark(sink, batch, task, sequence)
    assert find_mark((("other", b"1"), (MARK, mark.encode()))) == mark


def test_malformed_or_missing_marks() -> None:
    assert find_mark(()) is None
    assert find_mark(((MARK, b"only three parts"),)) is None
    assert find_mark(((MARK, b"s x 1 2"),)) is None
    assert without_mark(((MARK, b"s 1 2 3"), ("h", b"v"))) == (("h", b"v"),)


def test_resume_at() -> None:
    assert resume_at(None, "s", 5, 1, 0) == 0
    assert resume_at(Mark("s", 4, 0, 99), "s", 5, 1, 0) == 0  # an earlier batch: start over
    assert resume_at(Mark("s", 5, 1, 41), "s", 5, 1, 0) == 42  # this batch: after the stored
    with pytest.raises(StreamError, match="two Spark partitions"):
        resume_at(Mark("s", 5, 2, 0), "s", 5, 1, 0)
    with pytest.raises(StreamError, match="checkpoint is older"):
        resume_at(Mark("s", 6, 1, 0), "s", 5, 1, 0)


def test_sink_columns() -> None:
    header = ArrayType(
        StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    )
    full = StructType(
        [
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", BinaryType()),
            StructField("value", StringType()),
            StructField("timestamp", TimestampType()),
            StructField("headers", header),
        ]
    )
    assert Columns.of(full) == Columns(key=True, partition=True, headers=True, timestamp=True)
    assert Columns.of(StructType([StructField("value", BinaryType())])) == Columns(
        False, False, False, False
    )
    with pytest.raises(StreamError, match="no value column"):
        Columns.of(StructType([StructField("key", BinaryType())]))
    with pytest.raises(StreamError, match="unknown column"):
        Columns.of(StructType([StructField("value", BinaryType()), StructField("x", LongType())]))
    with pytest.raises(StreamError, match="column value of type double"):
        Columns.of(StructType([StructField("value", DoubleType())]))


def test_errors_come_back_from_spark_text() -> None:
    text = (
        "[STREAM_FAILED] Query terminated with exception: Traceback ...\n"
        '  File "sink.py", line 3, in write\n'
        "exactly.errors.TopicOwned: topic 't' is written by another streaming query\n"
        "\tat org.apache.spark..."
    )
    found = from_spark(RuntimeError(text))
    assert isinstance(found, TopicOwned)
    assert str(found) == "topic 't' is written by another streaming query"
    other = from_spark(RuntimeError("\n  java.lang.OutOfMemoryError: heap\nmore"))
    assert isinstance(other, StreamError) and "OutOfMemoryError" in str(other)
