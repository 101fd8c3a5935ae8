"""Spark's own log: WARN and above from every JVM component in a rotating file under the data
dir, and a failure's one line naming it (issue 30: the causes were thrown away)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from exactly.errors import StreamError
from exactly.spark.streaming import run_query

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def log_file(spark: SparkSession) -> Path:
    return Path(spark.conf.get("spark.exactly.log") or "")


def wait_for(path: Path, text: str, timeout: float = 10) -> str:
    """The file's text once it holds ``text`` (log4j flushes each event, but give it time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = path.read_text(errors="replace") if path.exists() else ""
        if text in found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path}: {found[-2000:]}")


def test_a_failed_task_leaves_its_stack_trace_in_the_log_file(spark: SparkSession) -> None:
    from pyspark.sql.functions import udf

    path = log_file(spark)
    assert path.name == "spark-exactly-tests.log" and path.parent.name == "logs"

    @udf("long")
    def explode(n):  # type: ignore[no-untyped-def]  # no hints: plain Python UDF
        raise ValueError(f"a task failed on row {n}")

    with pytest.raises(Exception, match="a task failed on row"):
        spark.range(3, numPartitions=1).select(explode("id")).collect()
    text = wait_for(path, "ValueError: a task failed on row")
    assert " WARN " in text and "TaskSetManager" in text  # "Lost task ...", off before
    assert " ERROR " in text and "Executor" in text
    assert "Traceback" in text  # the Python worker's, carried by the JVM's exception


def test_a_failed_query_names_the_log_file_in_one_line(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark.sql.functions import col

    rows = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    failing = rows.select((col("value") / col("value") * 0).cast("int").alias("x"))
    writer = (
        failing.selectExpr("assert_true(x = 1) AS checked")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(StreamError) as failed:
        run_query(writer, until_caught_up=False, trigger_seconds=0.2)
    message = str(failed.value)
    assert "\n" not in message
    assert message.endswith(f"(stack traces in {log_file(spark)})")
