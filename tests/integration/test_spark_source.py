"""The Spark source on both log backends: batch ranges, AvailableNow, rate limit, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from exactly.errors import ConfigError
from exactly.log import Log
from exactly.spark.streaming import from_spark
from tests.spark_helpers import fill, read_partition

pytestmark = pytest.mark.spark


def source(spark: SparkSession, log_url: str, topic: str, **options: str) -> DataFrame:
    reader = spark.readStream.format("exactly").option("log", log_url).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def drain(spark: SparkSession, df: DataFrame, where: Path) -> tuple[list[Any], list[int]]:
    """Run ``df`` with Trigger.AvailableNow into a parquet sink under ``where``.

    Returns the rows of this run (by the source's numbering: rows per batch), and every row the
    sink holds so far (the file sink is exactly-once, so a record read twice would show twice).
    """
    query = (
        df.writeStream.format("parquet")
        .option("path", str(where / "data"))
        .option("checkpointLocation", str(where / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "AvailableNow must end by itself once caught up"
    assert query.exception() is None
    per_batch = [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
    return spark.read.parquet(str(where / "data")).collect(), per_batch


def test_batch_read_of_offset_ranges(
    spark: SparkSession, log_url: str, log: Log, topic: str
) -> None:
    log.create_topic(topic, 3)
    fill(log, topic, 3, 20)
    df = (
        spark.read.format("exactly")
        .option("log", log_url)
        .option("topic", topic)
        .option("startingOffsets", '{"0": 15, "2": -1}')
        .option("endingOffsets", '{"1": 4}')
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<partition:int,offset:bigint,key:binary,value:binary,timestamp:timestamp,"
        "headers:array<struct<key:string,value:binary>>>"
    )
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.offset) for r in rows] == [(0, n) for n in range(15, 20)] + [
        (1, n) for n in range(4)
    ]
    stored = {(r.partition, r.offset): r for r in read_partition(log, topic, 0)}
    for row in rows[:5]:
        record = stored[(row.partition, row.offset)]
        assert (row.key, row.value) == (record.key, record.value)
        assert [(h.key, h.value) for h in row.headers] == list(record.headers)
        assert int(row.timestamp.timestamp() * 1000) == record.timestamp
    tuples = (
        spark.read.format("exactly")
        .option("log", log_url)
        .option("topic", topic)
        .option("arrow", "false")
        .load()
    )
    assert sorted(tuples.collect()) == sorted(
        spark.read.format("exactly").option("log", log_url).option("topic", topic).load().collect()
    )
    for arrow in ("true", "false"):
        bare = (
            spark.read.format("exactly")
            .option("log", log_url)
            .option("topic", topic)
            .option("arrow", arrow)
            .option("headers", "false")
            .load()
        )
        assert "headers" not in bare.columns
        assert sorted(bare.collect()) == sorted(r[:5] for r in tuples.collect())


def test_available_now_ends_and_offsets_survive_restarts(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    log.create_topic(topic, 2)
    fill(log, topic, 2, 30)
    rows, per_batch = drain(spark, source(spark, log_url, topic), tmp_path)
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, n) for p in range(2) for n in range(30)
    ]
    assert per_batch == [60]
    fill(log, topic, 2, 10, start=30)
    rows, per_batch = drain(spark, source(spark, log_url, topic), tmp_path)
    assert per_batch == [20]  # only what is new since the checkpoint
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, n) for p in range(2) for n in range(40)
    ]
    assert drain(spark, source(spark, log_url, topic), tmp_path)[1] == []


def test_read_tasks_group_partitions_and_the_grouping_is_recorded(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.source import LogStreamReader, ReadTask

    log.create_topic(topic, 5)
    fill(log, topic, 5, 12)
    grouped = source(spark, log_url, topic, readTasks="2").withColumn(
        "task", F.spark_partition_id()
    )
    rows, per_batch = drain(spark, grouped, tmp_path)
    assert per_batch == [60]
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, n) for p in range(5) for n in range(12)
    ]
    tasks = {r.partition: r.task for r in rows}
    assert len(set(tasks.values())) == 2  # five partitions, two read tasks
    assert all(len({r.task for r in rows if r.partition == p}) == 1 for p in range(5))
    recorded = (tmp_path / "checkpoint" / "offsets" / "0").read_text()
    assert '"tasks":2' in recorded.replace(" ", "")
    # a replay reads with the grouping its batch recorded, whatever the option says now
    reader = LogStreamReader(
        SourceOptions.parse({"log": log_url, "topic": topic, "readTasks": "3"})
    )
    end = {"0": 12, "1": 12, "2": 12, "3": 12, "4": 12, "tasks": 2}
    planned = reader.partitions({"0": 0}, end)
    assert len(planned) == 2 and all(isinstance(task, ReadTask) for task in planned)
    assert len(reader.partitions({"0": 0}, {k: v for k, v in end.items() if k != "tasks"})) == 5


def test_a_small_batch_is_read_by_fewer_tasks_and_no_new_record_is_no_batch(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.source import LogStreamReader

    log.create_topic(topic, 5)
    fill(log, topic, 5, 12)
    small = source(spark, log_url, topic, readTasks="2", readTaskRecords="100")
    rows, per_batch = drain(spark, small.withColumn("task", F.spark_partition_id()), tmp_path)
    assert per_batch == [60] and len(rows) == 60
    assert {r.task for r in rows} == {0}  # 60 offsets, fewer than 100: one task reads all five
    recorded = (tmp_path / "checkpoint" / "offsets" / "0").read_text()
    assert '"tasks":1' in recorded.replace(" ", "")
    reader = LogStreamReader(
        SourceOptions.parse(
            {"log": log_url, "topic": topic, "readTasks": "3", "readTaskRecords": "25"}
        )
    )
    start = {"0": 0, "1": 0, "2": 0, "3": 0, "4": 0, "tasks": 1}
    assert reader.latestOffset(start, ReadAllAvailable())["tasks"] == 3  # 60: a task per 25
    assert reader.latestOffset(start, ReadMaxRows(30))["tasks"] == 2  # the cap's 30 offsets
    assert reader.latestOffset(start, ReadMaxRows(10))["tasks"] == 1
    caught_up = {"0": 12, "1": 12, "2": 12, "3": 12, "4": 12, "tasks": 2}
    # nothing new: the position exactly as Spark holds it (another task count would be a batch)
    assert reader.latestOffset(caught_up, ReadAllAvailable()) == caught_up
    fill(log, topic, 5, 2, start=12)
    assert reader.latestOffset(caught_up, ReadAllAvailable())["tasks"] == 1  # 10 more offsets


def test_ranges_yield_each_tasks_offset_ranges_that_read_back_as_the_records(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    import pyarrow as pa

    from exactly.spark.datasource.options import SourceOptions
    from exactly.spark.datasource.source import OffsetRange, read, read_ranges, records_in

    log.create_topic(topic, 3)
    fill(log, topic, 3, 25)
    limited = source(spark, log_url, topic, ranges="true", readTasks="2", maxRecordsPerTrigger="30")
    assert limited.schema.simpleString() == "struct<partition:int,start:bigint,end:bigint>"
    rows, per_batch = drain(spark, limited, tmp_path)
    # Spark counts ranges: three batches of 30, 30 and 15 records, each a range per partition
    assert per_batch == [3, 3, 3]
    spans = sorted((r.partition, r.start, r.end) for r in rows)
    assert spans == [(p, s, min(s + 10, 25)) for p in range(3) for s in (0, 10, 20)]
    assert records_in({"0": 10, "1": 10, "2": 10, "tasks": 2}, {"0": 20, "1": 20, "2": 20}) == 30
    assert records_in(None, {"0": 5, "2": 7}) == 12
    # what the ranges read back is what the source reads without the option, in order
    options = SourceOptions.parse({"log": log_url, "topic": topic, "readRecords": "4"})
    batch = pa.RecordBatch.from_pylist(
        [{"partition": p, "start": s, "end": e} for p, s, e in spans],
        schema=pa.schema([("partition", pa.int32()), ("start", pa.int64()), ("end", pa.int64())]),
    )
    found = pa.Table.from_batches(list(read_ranges(options, iter([batch])))).to_pylist()
    expected: list[dict[str, Any]] = []
    for p, s, e in spans:
        expected += pa.Table.from_batches(list(read(options, OffsetRange(p, s, e)))).to_pylist()
    assert [(r["partition"], r["offset"]) for r in found] == [
        (p, n) for p, s, e in spans for n in range(s, e)
    ]
    assert found == expected
    with pytest.raises(ConfigError, match="ranges"):
        SourceOptions.parse({"log": log_url, "topic": topic, "ranges": "true", "fields": "[]"})


def test_rate_limit(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    log.create_topic(topic, 2)
    fill(log, topic, 2, 25)
    limited = source(spark, log_url, topic, maxRecordsPerTrigger="20")
    rows, per_batch = drain(spark, limited, tmp_path)
    assert len(rows) == 50
    assert per_batch == [20, 20, 10]


def test_starting_offsets(
    spark: SparkSession, log_url: str, log: Log, topic: str, tmp_path: Path
) -> None:
    log.create_topic(topic, 2)
    fill(log, topic, 2, 10)
    latest = source(spark, log_url, topic, startingOffsets="latest")
    assert drain(spark, latest, tmp_path / "latest")[1] == []
    fill(log, topic, 2, 2, start=10)
    rows, _ = drain(spark, latest, tmp_path / "latest")
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 10), (0, 11), (1, 10), (1, 11)]
    explicit = source(spark, log_url, topic, startingOffsets='{"0": 9}')
    rows, _ = drain(spark, explicit, tmp_path / "explicit")
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 9), (0, 10), (0, 11)] + [
        (1, n) for n in range(12)
    ]


def test_bad_options_fail_with_one_clear_line(spark: SparkSession, tmp_path: Path) -> None:
    bad = spark.read.format("exactly").option("log", f"sqlite://{tmp_path}").option("topic", "t")
    with pytest.raises(Exception, match="startingOffsets") as caught:
        bad.option("startingOffsets", "yesterday").load().collect()
    error = from_spark(caught.value)
    assert isinstance(error, ConfigError)
    assert str(error).startswith("option startingOffsets is 'yesterday': use earliest, latest")
    for options, message in (
        ({"fields": "type string"}, "option fields is 'type string': write a JSON list"),
        ({"fields": '[["type", "string"]]', "arrow": "false"}, "option fields needs option arrow"),
    ):
        reader = spark.read.format("exactly").option("log", f"sqlite://{tmp_path}")
        with pytest.raises(Exception, match="option fields") as caught:
            reader.option("topic", "t").options(**options).load().collect()
        error = from_spark(caught.value)
        assert isinstance(error, ConfigError)
        assert str(error).startswith(message)


def test_the_data_source_environment_holds_the_keys_query_starts_put(spark: SparkSession) -> None:
    """Spark 4.3 shares one environment map between the queries of a data source and each
    streaming start puts these keys into it from its own thread: present from the start, the
    puts only replace values, so concurrent starts cannot tear it (java.io.OptionalDataException
    in every task of ``exactly up``, 3 starts in about 49; ``datasource._RUNNER_KEYS``)."""
    from exactly.spark.datasource import _RUNNER_KEYS, NAME

    manager = spark._jsparkSession.sessionState().dataSourceManager()
    source = manager.lookupDataSource(NAME)
    environment = source.dataSourceCls().envVars()
    assert all(environment.containsKey(key) for key in _RUNNER_KEYS)
    assert not set(_RUNNER_KEYS) & set(spark.sparkContext.environment)  # the session's as it was
