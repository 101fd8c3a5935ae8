"""What one small micro-batch costs, whatever its size: the fixed part of a Spark job's time.

    .venv/bin/python bench/spark_batch_cost.py [--per-batch 2000] [--repeat 8]

In one ``local[2]`` session, on the embedded sqlite log:

(a) the aggregate job (``exactly aggregate``'s query into SQLite) over micro-batches of
    ``--per-batch`` events: Spark's own progress report per phase (median over the batches after
    the first two; ``addBatch`` is the foreachBatch function, reading included);
(b) a batch read of 2,000 records (``spark.read.format("exactly")...count()``) from topics of
    1, 2, 4 and 8 partitions (one read task per partition), beside the baselines measured in the
    same run: ``spark.range(2000).count()`` and a ``range`` group-by job.

The extra time per read task is the step between the partition counts; (b) with 4 partitions is
what reading a micro-batch of (a) costs on its own.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aggregate as bench_aggregate  # bench/aggregate.py: the events it fills a topic with
import exactly.spark.streaming as streaming
from exactly.aggregate import frame, job, open_db
from exactly.config import Settings
from exactly.log import Record, open_log
from exactly.spark.session import build_session


def median_ms(call: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000


def aggregate_phases(spark: Any, work: Path, per_batch: int) -> list[str]:
    log_url = f"sqlite://{work / 'events-log'}"
    bench_aggregate.fill(log_url, per_batch * 15)
    reports: list[dict[str, Any]] = []
    run_query = streaming.run_query

    def reporting(writer: Any, **options: Any) -> Any:
        return run_query(writer, on_batch=reports.append, **options)

    streaming.run_query = reporting  # type: ignore[assignment]
    try:
        plan = job.AggregatePlan(
            log_url, work / "checkpoint", until_caught_up=True, max_records_per_trigger=per_batch
        )
        with open_db(f"sqlite://{work / 'aggregates.db'}") as db:
            specs = frame.check(spark, plan.tables)
            with open_log(log_url) as log:
                start = job.prepare(log, db, plan, specs)
            job.run(spark, plan, db, specs, start)
    finally:
        streaming.run_query = run_query
    steady = reports[2:]
    lines = [
        f"(a) aggregate job, {len(steady)} micro-batches of {per_batch:,} events after two",
        "",
        "| phase | median ms |",
        "| --- | ---: |",
    ]
    for phase in sorted({name for report in steady for name in report["durationMs"]}):
        found = [report["durationMs"].get(phase, 0) for report in steady]
        lines.append(f"| {phase} | {statistics.median(found):,.0f} |")
    return lines


def read_tasks(spark: Any, work: Path, repeat: int) -> list[str]:
    url = f"sqlite://{work / 'read-log'}"
    counts = (1, 2, 4, 8)
    with open_log(url) as log:
        for partitions in counts:
            log.create_topic(f"t{partitions}", partitions)
            for partition in range(partitions):
                records = [Record(b"x" * 300) for _ in range(2000 // partitions)]
                log.append(f"t{partitions}", partition, records)
    ranged = median_ms(spark.range(2000).count, repeat)
    lines = [
        "(b) 2,000 records counted, one read task per partition",
        "",
        "| job | median ms |",
        "| --- | ---: |",
        f"| baseline: spark.range(2000).count() | {ranged:,.0f} |",
    ]
    grouped = spark.range(2000).selectExpr("id % 3 AS k").groupBy("k").count()
    lines.append(
        f"| baseline: range group-by, collect | {median_ms(grouped.collect, repeat):,.0f} |"
    )
    for partitions in counts:
        df = spark.read.format("exactly").option("log", url).option("topic", f"t{partitions}")
        loaded = df.load()
        loaded.count()  # warm the Python workers
        counted = median_ms(loaded.count, repeat)
        lines.append(f"| exactly source, {partitions} partition(s) | {counted:,.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-batch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=8)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="bench-batch-cost-"))
    spark = build_session(Settings(data_dir=work / "spark"), "bench-batch-cost", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        print("\n".join(aggregate_phases(spark, work, args.per_batch)), end="\n\n")
        print("\n".join(read_tasks(spark, work, args.repeat)))
        print(f"load after: {os.getloadavg()}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
