"""What reading a query's progress costs each poll: PySpark's ``recentProgress`` against
``exactly.spark.streaming.ProgressReader``.

    .venv/bin/python bench/progress_reads.py [--kept 90] [--calls 20]

Every streaming command polls its query once a second for the micro-batches' reports
(``run_query``); ``exactly up`` does so for each of its queries. A ``rate`` source into a
``noop`` sink runs 50 ms micro-batches until Spark keeps ``--kept`` reports (it keeps at most
``spark.sql.streaming.numRecentProgressUpdates``, 100); then each way is called ``--calls``
times in turn: ``recentProgress`` (every kept report turned into JSON in the JVM and read back
in Python) and ``new_reports`` (the reports newer than the last one read: here none or one).
Prints the wall time and the Python process's CPU per call, medians of the calls.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exactly.spark.streaming import ProgressReader


def cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def timed(call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``call``."""
    walls, cpus = [], []
    for _ in range(calls):
        began, used = time.perf_counter(), cpu()
        call()
        walls.append(time.perf_counter() - began)
        cpus.append(cpu() - used)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def main() -> None:
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kept", type=int, default=90)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    stream = spark.readStream.format("rate").option("rowsPerSecond", 100).load()
    query = (
        stream.groupBy((stream.value % 10).alias("k"))
        .count()
        .writeStream.outputMode("complete")
        .format("noop")
        .trigger(processingTime="50 milliseconds")
        .start()
    )
    progress = ProgressReader(query)
    while len(query.recentProgress) < args.kept:
        progress.new_reports()
        time.sleep(0.5)
    progress.new_reports()
    kept = len(query.recentProgress)
    rows = [
        ("PySpark's recentProgress", timed(lambda: query.recentProgress, args.calls)),
        ("new_reports", timed(lambda: progress.new_reports(), args.calls)),
    ]
    query.stop()
    spark.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\na query with {kept} reports kept, a micro-batch every 50 ms, {args.calls} calls")
    print("\n| read | wall ms per call | Python CPU ms per call |")
    print("| --- | ---: | ---: |")
    for name, (wall, used) in rows:
        print(f"| {name} | {wall:.2f} | {used:.2f} |")


if __name__ == "__main__":
    main()
