"""Where a Spark job's time goes: the rate of each stage of a streaming job, in one run.

    .venv/bin/python bench/spark_stages.py [--records 1000000] [--repeat 3]

One topic of 4 partitions on the embedded sqlite log (values of 300 bytes, UUID keys), Spark
``local[2]`` in one session; each stage adds one piece to the one before, so the drop from row to
row is that piece's price:

1. batch read, ``noop`` write (the source's reader alone);
2. streaming read (Trigger.AvailableNow), ``noop`` sink: the streaming source and micro-batch;
3. the same plus an identity ``mapInArrow``: one more trip JVM -> Python worker -> JVM;
4. streaming copy through the ``exactly`` sink, ``guarantee=at-least-once``: the appends;
5. the same, exactly-once (fenced writer, tail read, marks);
6. outside Spark: the dedupe job's task (``dedupe_partition``, rocksdb store) over Arrow batches
   of the same records, on one core.

Medians of ``--repeat`` runs after one warm-up; prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql import DataFrame, SparkSession

from exactly.config import Settings
from exactly.dedupe.rocksdb import RocksDBStore
from exactly.dedupe.task import TaskPlan, dedupe_partition
from exactly.log import Record, open_log
from exactly.spark.datasource.source import ARROW_SCHEMA
from exactly.spark.session import build_session

PARTITIONS = 4
VALUE = b'{"type": "track", "event": "Viewed"}' + b" " * 264


def fill(url: str, records: int) -> list[bytes]:
    rng = random.Random(1)
    keys = [str(uuid.UUID(int=rng.getrandbits(128), version=4)).encode() for _ in range(records)]
    with open_log(url) as log:
        log.create_topic("source", PARTITIONS)
        per = records // PARTITIONS
        for partition in range(PARTITIONS):
            mine = keys[partition * per : (partition + 1) * per]
            for at in range(0, len(mine), 10_000):
                chunk = mine[at : at + 10_000]
                log.append("source", partition, [Record(VALUE, key=k) for k in chunk])
    return keys[: per * PARTITIONS]


class Stages:
    def __init__(self, spark: SparkSession, url: str, work: Path) -> None:
        self.spark, self.url, self.work = spark, url, work
        self.runs = 0

    def _fresh(self, name: str) -> Path:
        self.runs += 1
        return self.work / f"{name}-{self.runs}"

    def batch_read(self) -> float:
        began = time.perf_counter()
        reader = self.spark.read.format("exactly").option("log", self.url)
        reader.option("topic", "source").load().write.format("noop").mode("overwrite").save()
        return time.perf_counter() - began

    def stream(
        self, transform: Callable[[DataFrame], DataFrame] | None = None, guarantee: str = ""
    ) -> float:
        df = (
            self.spark.readStream.format("exactly")
            .option("log", self.url)
            .option("topic", "source")
            .load()
        )
        if transform is not None:
            df = transform(df)
        checkpoint = self._fresh("checkpoint")
        writer = df.writeStream.option("checkpointLocation", str(checkpoint))
        if guarantee:
            topic = f"copy{self.runs}"
            with open_log(self.url) as log:
                log.create_topic(topic, PARTITIONS)
            writer = (
                writer.format("exactly")
                .option("log", self.url)
                .option("topic", topic)
                .option("guarantee", guarantee)
            )
        else:
            writer = writer.format("noop")
        began = time.perf_counter()
        writer.trigger(availableNow=True).start().awaitTermination()
        return time.perf_counter() - began


def identity(df: DataFrame) -> DataFrame:
    def same(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches

    return df.mapInArrow(same, df.schema)


def dedupe_task(url: str, keys: list[bytes], work: Path) -> float:
    """The dedupe job's task over every record as one partition's batches (one core)."""
    with open_log(url) as log:
        for topic in ("raw", "events", "raw.rejected"):
            log.create_topic(topic, 1, exist_ok=True)
    headers = ARROW_SCHEMA.field("headers").type
    batches = []
    for start in range(0, len(keys), 10_000):
        chunk = keys[start : start + 10_000]
        n = len(chunk)
        stamps = [1_700_000_000_000_000 + 1000 * (start + i) for i in range(n)]
        batches.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([0] * n, pa.int32()),
                    pa.array(range(start, start + n), pa.int64()),
                    pa.array(chunk, pa.binary()),
                    pa.array([VALUE] * n, pa.binary()),
                    pa.array(stamps, pa.timestamp("us", tz="UTC")),
                    pa.array([[]] * n, headers),
                ],
                schema=ARROW_SCHEMA,
            )
        )
    store = work / f"store-{time.monotonic_ns()}"
    plan = TaskPlan(url, "raw", "events", "raw.rejected", RocksDBStore(store))
    began = time.perf_counter()
    passed = sum(batch.num_rows for batch in dedupe_partition(plan, iter(batches)))
    seconds = time.perf_counter() - began
    assert passed == len(keys)
    shutil.rmtree(store)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="exactly-stages-"))
    try:
        url = f"sqlite://{work / 'log'}"
        keys = fill(url, args.records)
        records = len(keys)
        spark = build_session(Settings(data_dir=work), "exactly-bench-stages", master="local[2]")
        stages = Stages(spark, url, work)
        measures: list[tuple[str, Callable[[], float]]] = [
            ("1. batch read, noop", stages.batch_read),
            ("2. streaming read, noop sink", lambda: stages.stream()),
            ("3. + identity mapInArrow", lambda: stages.stream(identity)),
            ("4. streaming copy, at-least-once", lambda: stages.stream(None, "at-least-once")),
            ("5. streaming copy, exactly-once sink", lambda: stages.stream(None, "exactly-once")),
            ("6. dedupe task alone, 1 core", lambda: dedupe_task(url, keys, work)),
        ]
        for _, measure in measures:
            measure()  # warm-up
        rates: dict[str, list[float]] = {name: [] for name, _ in measures}
        for _ in range(args.repeat):
            for name, measure in measures:
                rates[name].append(records / measure())
        spark.stop()
        print(
            f"machine: {platform.platform()}, {os.cpu_count()} cores, "
            f"load {os.getloadavg()[0]:.1f}; {records:,} records\n"
        )
        print("| stage | runs (records/s) | median |")
        print("| --- | --- | ---: |")
        for name, found in rates.items():
            runs = ", ".join(f"{r:,.0f}" for r in found)
            print(f"| {name} | {runs} | {statistics.median(found):,.0f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
