"""The exactly-once sink on both log backends: replays, partial batches, failed tasks, zombies."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from exactly.errors import Fenced, StreamError, TopicOwned
from exactly.events import partition_for
from exactly.log import Log, Record, open_log
from exactly.log.columns import HEADERS, record_columns
from exactly.spark.datasource import lease, register_staged
from exactly.spark.datasource.marks import MARK, Mark, find_mark, without_mark
from exactly.spark.datasource.sink import (
    PROGRESS_GROUP,
    Columns,
    PartitionOutput,
    cluster_by_partition,
)
from exactly.spark.streaming import from_spark
from tests.spark_helpers import assert_copied, content, fill, read_partition

pytestmark = pytest.mark.spark


def copy(
    spark: SparkSession,
    log_url: str,
    source: str,
    destination: str,
    checkpoint: Path,
    transform: Callable[[DataFrame], DataFrame] | None = None,
    max_records_per_trigger: int = 40,
    sink_format: str = "exactly",
    **sink_options: str,
) -> StreamingQuery:
    """Run a copy with Trigger.AvailableNow until it ends; the finished (or failed) query."""
    df = (
        spark.readStream.format("exactly")
        .option("log", log_url)
        .option("topic", source)
        .option("maxRecordsPerTrigger", str(max_records_per_trigger))
        .load()
    )
    if transform is not None:
        df = transform(df)
    writer = (
        df.writeStream.format(sink_format)
        .option("log", log_url)
        .option("topic", destination)
        .option("checkpointLocation", str(checkpoint))
        .option("appendRecords", "7")
    )
    for name, value in sink_options.items():
        writer = writer.option(name, value)
    query = writer.trigger(availableNow=True).start()
    with contextlib.suppress(StreamingQueryException):
        query.awaitTermination(240)  # the test looks at query.exception()
    assert not query.isActive
    return query


def forget_last_commit(checkpoint: Path) -> int:
    """Make Spark replay the last batch, as after a crash between the sink's commit and its own."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    return int(commits[-1].name)


def test_copy_is_exactly_once_and_a_replayed_batch_adds_nothing(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    source, destination = f"{topic}-src", f"{topic}-dst"
    log.create_topic(source, 2)
    log.create_topic(destination, 2)
    fill(log, source, 2, 50)
    query = copy(spark, log_url, source, destination, tmp_path)
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [40, 40, 20]
    assert_copied(log, source, destination)
    sink = query.id
    assert log.committed_offsets(PROGRESS_GROUP + sink, destination) == log.end_offsets(destination)

    replayed = forget_last_commit(tmp_path)
    query = copy(spark, log_url, source, destination, tmp_path)
    assert query.exception() is None
    assert query.recentProgress[0]["batchId"] == replayed
    assert_copied(log, source, destination)  # the replay found its records and appended none

    fill(log, source, 2, 5, start=50)
    assert copy(spark, log_url, source, destination, tmp_path).exception() is None
    assert_copied(log, source, destination)


def even_offsets_shouted(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A stage: the records at even offsets, their values upper-cased, without the offset column."""
    import pyarrow.compute as pc

    for batch in batches:
        kept = batch.filter(pc.equal(pc.bit_wise_and(batch.column("offset"), 1), 0))
        kept = kept.drop_columns(["offset"])
        values = pc.utf8_upper(kept.column("value").cast(pa.string())).cast(pa.binary())
        yield kept.set_column(kept.schema.get_field_index("value"), "value", values)


def test_a_staged_sink_writes_what_its_stage_yields_exactly_once(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    source, destination = f"{topic}-src", f"{topic}-dst"
    log.create_topic(source, 2)
    log.create_topic(destination, 2)
    fill(log, source, 2, 50)
    name = f"exactly-staged-{topic}"
    register_staged(spark, name, even_offsets_shouted, Columns(True, True, True, True))

    def expected(partition: int) -> list[tuple[Any, ...]]:
        found = content(read_partition(log, source, partition))
        return [(k, v.upper(), h, t) for k, v, h, t in found[::2]]

    for _ in range(2):  # the second run replays the last batch: it adds nothing
        query = copy(spark, log_url, source, destination, tmp_path, sink_format=name)
        assert query.exception() is None
        for partition in range(2):
            assert content(read_partition(log, destination, partition)) == expected(partition)
        forget_last_commit(tmp_path)


def test_a_partly_written_batch_is_completed(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    """As if a crashed attempt had stored the first 5 records of batch 0 for partition 0."""
    source, destination = f"{topic}-src", f"{topic}-dst"
    log.create_topic(source, 2)
    log.create_topic(destination, 2)
    fill(log, source, 2, 30)
    sink = "partial-sink"
    lease.take(log, destination, sink, str(tmp_path))
    stored = read_partition(log, source, 0)[:5]
    with log.open_writer(destination, 0, sink) as writer:
        writer.append(
            [
                Record(
                    r.value, r.key, (*r.headers, (MARK, Mark(sink, 0, 0, n).encode())), r.timestamp
                )
                for n, r in enumerate(stored)
            ]
        )
        writer.commit()
    query = copy(spark, log_url, source, destination, tmp_path, sinkId=sink)
    assert query.exception() is None
    assert_copied(log, source, destination)


def fail_first_attempt(log_url: str, destination: str, evidence: Path) -> Callable[..., Iterator]:  # type: ignore[type-arg]
    """A mapInArrow function: in Spark partition 0's first attempt, fail after 300 rows.

    Before failing it notes how many records partition 0 of the destination holds, to show the
    failed attempt had written some; on SQLite it waits up to 30 s for the sink's first append.
    """

    def run(batches: Iterator) -> Iterator:  # type: ignore[type-arg]
        import time

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        failing = context.partitionId() == 0 and context.attemptNumber() == 0
        seen = 0
        for batch in batches:
            for at in range(0, batch.num_rows, 10):
                yield batch.slice(at, 10)
                seen += min(10, batch.num_rows - at)
                if failing and seen >= 300:  # 300 KB: past the Python worker's output buffer
                    with open_log(log_url) as log:
                        # let the sink append what it got: a loaded machine takes seconds
                        deadline = time.monotonic() + (30 if log_url.startswith("sqlite") else 1)
                        while not log.end_offset(destination, 0) and time.monotonic() < deadline:
                            time.sleep(0.1)
                        evidence.write_text(json.dumps(log.end_offset(destination, 0)))
                    raise RuntimeError("injected failure of a first attempt")

    return run


def test_a_task_that_fails_on_its_first_attempt(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    source, destination = f"{topic}-src", f"{topic}-dst"
    log.create_topic(source, 2)
    log.create_topic(destination, 2)
    for partition in range(2):
        log.append(
            source,
            partition,
            [Record(b"%d:%d:" % (partition, n) + b"x" * 1000) for n in range(400)],
        )
    evidence = tmp_path / "evidence.json"
    run = fail_first_attempt(log_url, destination, evidence)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        query = copy(
            spark,
            log_url,
            source,
            destination,
            tmp_path / "checkpoint",
            transform=lambda df: df.mapInArrow(run, df.schema),
            max_records_per_trigger=1000,
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert query.exception() is None
    assert evidence.exists(), "the first attempt must have failed"
    if log_url.startswith("sqlite"):
        assert json.loads(evidence.read_text()) > 0  # it had appended records before failing
    assert_copied(log, source, destination)


def test_a_zombie_writer_is_fenced(log_url: str, log: Log, topic: str) -> None:
    """A stale attempt that wakes up after its successor took over cannot add a record."""
    log.create_topic(topic, 1)
    sink, batch = "zombie-sink", 3
    rows = [(b"r%d" % n, None, (), None) for n in range(6)]  # value, key, headers, timestamp
    zombie = PartitionOutput(log, topic, 0, Mark(sink, batch, 0, 0), since=0, chunk=2)
    zombie.add(rows[:3])  # appended (or, on Kafka, produced) them, then stalled
    with open_log(log_url) as elsewhere:
        successor = PartitionOutput(elsewhere, topic, 0, Mark(sink, batch, 0, 0), since=0, chunk=2)
        if log_url.startswith("sqlite"):
            assert successor.skipped == 3  # found what the zombie had stored
        successor.add(rows)
        successor.finish()
        successor.close()
        with pytest.raises(Fenced):
            zombie.add(rows[3:])
            zombie.finish()
        zombie.close()
    assert [r.value for r in read_partition(log, topic, 0)] == [row[0] for row in rows]


def test_the_last_record_of_each_append_is_marked(log_url: str, log: Log, topic: str) -> None:
    """On sqlite, where an append is stored whole, only its last record carries the mark, and a
    successor counts what is stored from it; on Kafka (Tansu shows aborted transactions) every
    record does. Rows and record columns alike."""
    log.create_topic(topic, 1)
    sink = "sparse-sink"
    rows = [(b"r%d" % n, None, (("h", b"%d" % n),), None) for n in range(8)]
    first = PartitionOutput(log, topic, 0, Mark(sink, 0, 0, 0), since=0, chunk=3)
    first.add(rows[:4])  # appends of 3 and 1
    first.add_columns(
        record_columns(
            pa.array([row[0] for row in rows[4:]], pa.binary()),
            pa.nulls(4, pa.binary()),
            pa.array([[("h", b"%d" % n)] for n in range(4, 8)], HEADERS),
            pa.nulls(4, pa.int64()),
        )
    )  # appends of 3 and 1
    first.finish()
    first.close()
    stored = read_partition(log, topic, 0)
    assert [r.value for r in stored] == [row[0] for row in rows]
    assert [without_mark(r.headers) for r in stored] == [(("h", b"%d" % n),) for n in range(8)]
    marks = {n: find_mark(r.headers) for n, r in enumerate(stored)}
    marked = [n for n, mark in marks.items() if mark is not None]
    assert marked == ([2, 3, 6, 7] if log_url.startswith("sqlite") else list(range(8)))
    assert all(marks[n] == Mark(sink, 0, 0, n) for n in marked)
    successor = PartitionOutput(log, topic, 0, Mark(sink, 0, 0, 0), since=0, chunk=3)
    assert successor.skipped == 8
    successor.close()


def test_a_second_query_is_refused_until_the_topic_is_released(
    spark: SparkSession, tmp_path: Path, topic: str
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        for name in ("a", "b", "dst"):
            log.create_topic(name, 2)
        fill(log, "a", 2, 5)
        fill(log, "b", 2, 5)
        assert copy(spark, log_url, "a", "dst", tmp_path / "first").exception() is None
        other = copy(spark, log_url, "b", "dst", tmp_path / "second")
        error = from_spark(other.exception())  # type: ignore[arg-type]
        assert isinstance(error, TopicOwned)
        assert f"checkpoint {tmp_path / 'first'}" in str(error)
        assert "exactly sink release dst" in str(error)
        assert lease.release(log, "dst") is not None
        assert copy(spark, log_url, "b", "dst", tmp_path / "second").exception() is None
        assert lease.holder(log, "dst").checkpoint == str(tmp_path / "second")  # type: ignore[union-attr]
        assert sum(log.end_offsets("dst").values()) == 20


def test_rows_of_one_output_partition_from_two_tasks_are_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("src", 2)
        log.create_topic("dst", 2)
        fill(log, "src", 2, 20)
    query = copy(
        spark,
        log_url,
        "src",
        "dst",
        tmp_path / "checkpoint",
        transform=lambda df: df.withColumn("partition", F.lit(0)),
    )
    error = from_spark(query.exception())  # type: ignore[arg-type]
    assert isinstance(error, StreamError | Fenced), error
    assert "cluster_by_partition" in str(error) or isinstance(error, Fenced)


def test_cluster_by_partition(spark: SparkSession, tmp_path: Path) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("src", 2)
        log.create_topic("dst", 3)
        fill(log, "src", 2, 40)

        def rekey(df: DataFrame) -> DataFrame:
            return cluster_by_partition(df.select("key", "value", "headers", "timestamp"), 3)

        checkpoint = tmp_path / "checkpoint"
        for _ in range(2):
            query = copy(spark, log_url, "src", "dst", checkpoint, transform=rekey, order="sorted")
            assert query.exception() is None
            forget_last_commit(checkpoint)
        expected: dict[int, Counter[tuple[object, ...]]] = {p: Counter() for p in range(3)}
        for partition in range(2):
            for row in content(read_partition(log, "src", partition)):
                expected[partition_for(row[0] if row[0] is not None else row[1], 3)][row] += 1
        for partition in range(3):
            assert Counter(content(read_partition(log, "dst", partition))) == expected[partition]


def test_bad_columns_are_refused_when_the_query_starts(spark: SparkSession, tmp_path: Path) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    with open_log(log_url) as log:
        log.create_topic("src", 1)
        log.create_topic("dst", 1)
    query = copy(
        spark,
        log_url,
        "src",
        "dst",
        tmp_path / "checkpoint",
        transform=lambda df: df.withColumn("extra", F.lit(1)),
    )
    error = from_spark(query.exception())  # type: ignore[arg-type]
    assert isinstance(error, StreamError)
    assert "unknown column(s) ['extra']" in str(error)
