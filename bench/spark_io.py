"""Spark on the log: the source (Arrow batches vs tuples) and the sink (exactly-once vs plain).

    .venv/bin/python bench/spark_io.py [--backend sqlite|kafka|all] [--records 200000]
        [--batches 4] [--repeat 3] [--kafka-options QUERY]

A topic of 4 partitions and ``--records`` 300-byte records with 8-byte keys; Spark ``local[2]``.

* **Read**: a batch read of the whole topic, every column consumed (``noop`` write), with the
  reader returning Arrow record batches (the default) or plain tuples (``arrow=false``).
* **Copy**: a streaming copy with Trigger.AvailableNow in ``--batches`` micro-batches,
  through the sink with its exactly-once protocol (the default: fenced writers, tail reads,
  marks) and with ``guarantee=at-least-once`` (plain appends of the same chunks), each into a
  fresh topic. The two alternate, so both see the same load; the ratio is of paired runs. Rates
  count the time Spark spent in the micro-batches (``triggerExecution``), not query start-up.

Each figure is the median of ``--repeat`` runs, after one warm-up of each kind. Prints a table.
``--kafka-options`` adds query options to the Kafka log's URL (to measure client settings).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.config import Settings
from exactly.log import Record, open_log
from exactly.spark.session import build_session

PARTITIONS = 4
VALUE = b"x" * 300


def fill(url: str, records: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    with open_log(url) as log:
        log.create_topic(topic, PARTITIONS)
        per_partition = records // PARTITIONS
        for partition in range(PARTITIONS):
            for first in range(0, per_partition, 5000):
                count = min(5000, per_partition - first)
                batch = [Record(VALUE, key=b"%08d" % (first + n)) for n in range(count)]
                log.append(topic, partition, batch)
    return topic


def read_seconds(spark: object, url: str, topic: str, arrow: bool) -> float:
    reader = spark.read.format("exactly").option("log", url).option("topic", topic)  # type: ignore[attr-defined]
    df = reader.option("arrow", str(arrow).lower()).load()
    began = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - began


def copy_seconds(
    spark: object, url: str, topic: str, records: int, batches: int, guarantee: str, work: Path
) -> float:
    """Seconds Spark spent in the micro-batches of a copy of ``topic`` into a fresh topic."""
    destination = f"{topic}-{uuid.uuid4().hex[:6]}"
    with open_log(url) as log:
        log.create_topic(destination, PARTITIONS)
    query = (
        spark.readStream.format("exactly")  # type: ignore[attr-defined]
        .option("log", url)
        .option("topic", topic)
        .option("maxRecordsPerTrigger", str(-(-records // batches)))
        .load()
        .writeStream.format("exactly")
        .option("log", url)
        .option("topic", destination)
        .option("guarantee", guarantee)
        .option("checkpointLocation", str(work / destination))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    copied = sum(p["numInputRows"] for p in progress)
    assert copied == records, f"copied {copied} of {records}"
    with open_log(url) as log:
        assert sum(log.end_offsets(destination).values()) >= records
    return sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000


def median(repeat: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(repeat))


def bench_backend(
    name: str, url: str, spark: object, records: int, batches: int, repeat: int, work: Path
) -> list[list[str]]:
    rows: list[list[str]] = []
    topic = fill(url, records)
    for arrow in (True, False):
        read_seconds(spark, url, topic, arrow)  # warm-up: Python workers, JIT
        rate = records / median(repeat, lambda arrow=arrow: read_seconds(spark, url, topic, arrow))
        kind = "Arrow record batches" if arrow else "plain tuples"
        rows.append([name, f"read into Spark, {kind}", f"{rate:,.0f}"])
        print(rows[-1], flush=True)
    for guarantee in ("exactly-once", "at-least-once"):  # warm-up
        copy_seconds(spark, url, topic, records, batches, guarantee, work)
    exact, plain = [], []
    for _ in range(repeat):
        exact.append(copy_seconds(spark, url, topic, records, batches, "exactly-once", work))
        plain.append(copy_seconds(spark, url, topic, records, batches, "at-least-once", work))
    copy = f"copy in {batches} micro-batches"
    rows.append([name, f"{copy}, exactly-once sink", f"{records / statistics.median(exact):,.0f}"])
    rows.append(
        [name, f"{copy}, at-least-once appends", f"{records / statistics.median(plain):,.0f}"]
    )
    ratio = statistics.median(p / e for e, p in zip(exact, plain, strict=True))
    rows.append([name, f"{copy}, exactly-once / at-least-once (paired)", f"{ratio:.2f}"])
    print(rows[-3:], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "kafka", "all"], default="all")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--kafka-options",
        default="",
        help="query options for the Kafka log's URL, e.g. the earlier client defaults: "
        "reconnect.backoff.ms=100&fetch.wait.max.ms=10",
    )
    args = parser.parse_args()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(scratch)
        spark = build_session(Settings(data_dir=work), "exactly-bench", master="local[2]")
        if args.backend in ("sqlite", "all"):
            url = f"sqlite://{work / 'log'}"
            rows += bench_backend(
                "sqlite", url, spark, args.records, args.batches, args.repeat, work
            )
        if args.backend in ("kafka", "all"):
            from tests.servers import TansuBroker

            with TansuBroker() as broker:
                name = "kafka (Tansu)" + (f" ?{args.kafka_options}" if args.kafka_options else "")
                url = f"{broker.url}?{args.kafka_options}" if args.kafka_options else broker.url
                rows += bench_backend(
                    name, url, spark, args.records, args.batches, args.repeat, work
                )
        spark.stop()
    print()
    cores, python = os.cpu_count(), platform.python_version()
    print(f"machine: {platform.platform()}, {cores} cores, Python {python}")
    print(f"{args.records:,} records of 300 bytes, {PARTITIONS} partitions, Spark local[2]\n")
    print("| backend | measure | records/s |")
    print("| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
