"""What one small micro-batch costs, whatever its size: the fixed part of a Spark job's time.

    .venv/bin/python bench/spark_batch_cost.py [--per-batch 2000] [--repeat 8]

In one ``local[2]`` session, on the embedded sqlite log:

(a) the aggregate job (``exactly aggregate``'s query into SQLite) over micro-batches of
    ``--per-batch`` events: Spark's own progress report per phase (median over the batches after
    the first two; ``addBatch`` is the foreachBatch function, reading included), reading with one
    task per log partition and with one per core (option ``readTasks``, what the jobs do),
    alternated ``--rounds`` times;
(b) a batch read of 2,000 records (``spark.read.format("exactly")...count()``) from topics of
    1, 2, 4 and 8 partitions (one read task per partition), beside the baselines measured in the
    same run: ``spark.range(2000).count()`` and a ``range`` group-by job; then 4 and 8
    partitions read by 2 tasks (``readTasks``).

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
import exactly.spark.batches as batches
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


def aggregate_phases(spark: Any, work: Path, per_batch: int, per_core: bool) -> dict[str, float]:
    """Median ms per phase of the aggregate job's micro-batches after the first two.

    ``per_core``: one read task per core, as the jobs read; else one per log partition.
    """
    name = "per-core" if per_core else "per-partition"
    work.mkdir(parents=True, exist_ok=True)
    log_url = f"sqlite://{work / f'events-log-{name}'}"
    bench_aggregate.fill(log_url, per_batch * 15)
    reports: list[dict[str, Any]] = []
    run_query = streaming.run_query
    read_tasks = batches.read_tasks

    def reporting(writer: Any, **options: Any) -> Any:
        return run_query(writer, on_batch=reports.append, **options)

    streaming.run_query = reporting  # type: ignore[assignment]
    if not per_core:
        batches.read_tasks = lambda spark: 1 << 20  # type: ignore[assignment]
    try:
        plan = job.AggregatePlan(
            log_url,
            work / f"checkpoint-{name}",
            until_caught_up=True,
            max_records_per_trigger=per_batch,
        )
        with open_db(f"sqlite://{work / f'aggregates-{name}.db'}") as db:
            specs = frame.check(spark, plan.tables)
            with open_log(log_url) as log:
                start = job.prepare(log, db, plan, specs)
            job.run(spark, plan, db, specs, start)
    finally:
        streaming.run_query = run_query
        batches.read_tasks = read_tasks  # type: ignore[assignment]
    steady = reports[2:]
    phases = sorted({phase for report in steady for phase in report["durationMs"]})
    return {
        phase: statistics.median(report["durationMs"].get(phase, 0) for report in steady)
        for phase in phases
    }


def aggregate_lines(spark: Any, work: Path, per_batch: int, rounds: int) -> list[str]:
    """(a): the two ways of reading, alternated ``rounds`` times, medians of the rounds."""
    runs: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for round_ in range(rounds):
        for per_core in (False, True):
            runs[per_core].append(aggregate_phases(spark, work / f"a{round_}", per_batch, per_core))
    lines = [
        f"(a) aggregate job, micro-batches of {per_batch:,} events from 4 log partitions "
        f"(medians over the batches after two, then over {rounds} alternated runs)",
        "",
        "| phase | one read task per partition, ms | one per core, ms |",
        "| --- | ---: | ---: |",
    ]
    phases = sorted({phase for found in runs[True] + runs[False] for phase in found})
    for phase in phases:
        old, new = (
            statistics.median(found.get(phase, 0) for found in runs[per_core])
            for per_core in (False, True)
        )
        lines.append(f"| {phase} | {old:,.0f} | {new:,.0f} |")
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
    for partitions in counts[2:]:
        df = spark.read.format("exactly").option("log", url).option("topic", f"t{partitions}")
        loaded = df.option("readTasks", "2").load()
        loaded.count()
        counted = median_ms(loaded.count, repeat)
        lines.append(f"| exactly source, {partitions} partitions, readTasks 2 | {counted:,.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-batch", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="alternated runs of (a)")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="bench-batch-cost-"))
    spark = build_session(Settings(data_dir=work / "spark"), "bench-batch-cost", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    try:
        print("\n".join(aggregate_lines(spark, work, args.per_batch, args.rounds)), end="\n\n")
        print("\n".join(read_tasks(spark, work, args.repeat)))
        print(f"load after: {os.getloadavg()}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
