"""CPU of a small micro-batch read by one task against two: the source option ``readTaskRecords``.

    .venv/bin/python bench/read_task_records.py [--per-batch 2000] [--batches 30] [--rounds 3]
                                                [--records 5000]

The jobs set ``readTasks`` to the cores (two here) and ``readTaskRecords`` to
``exactly.spark.session.READ_TASK_RECORDS``: a micro-batch of fewer offsets than that is read by
one task. In one ``local[2]`` session, the aggregate job (``exactly aggregate``'s query into
SQLite) works off ``--batches`` micro-batches of ``--per-batch`` events from four log
partitions, with ``READ_TASK_RECORDS`` at 1 (two read tasks a batch, the default) and at
``--records`` (5,000: one), in turn (the order swapped each round) ``--rounds`` times on fresh
checkpoints, after a first run that warms the JVM and is not counted.

What is measured is CPU, not wall time: two tasks on two idle cores end sooner than one, but in
``exactly up`` the cores are shared by four queries, the collector and the directors. The bench
moves itself into a cgroup of its own (cgroup v1 ``cpuacct``, as root) before Spark starts, so
the JVM, Spark's Python daemons and their workers are all counted, whatever else the machine
runs; each run's CPU is divided by its micro-batches (query start-up included, the same in both
ways). Prints a markdown table; the ratio per round is the figure to quote on a busy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aggregate as bench_aggregate  # bench/aggregate.py: the events it fills a topic with
import exactly.spark.session as session
from exactly.aggregate import frame, job, open_db
from exactly.config import Settings
from exactly.log import open_log

CGROUP = Path("/sys/fs/cgroup/cpuacct")


def own_cgroup() -> Path:
    """A cpuacct cgroup holding this process (and so every process it starts from now on)."""
    group = CGROUP / f"exactly-bench-{os.getpid()}"
    group.mkdir()
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


def leave(group: Path) -> None:
    """Back to the root cgroup; the bench's own is removed once empty."""
    (CGROUP / "cgroup.procs").write_text(str(os.getpid()))
    with contextlib.suppress(OSError):
        group.rmdir()


def cpu_seconds(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


def run(spark: Any, work: Path, per_batch: int, batches: int, group: Path) -> tuple[float, int]:
    """The aggregate job over ``batches`` micro-batches: CPU seconds, micro-batches run."""
    log_url = f"sqlite://{work / 'events-log'}"
    bench_aggregate.fill(log_url, per_batch * batches)
    plan = job.AggregatePlan(
        log_url, work / "checkpoint", until_caught_up=True, max_records_per_trigger=per_batch
    )
    with open_db(f"sqlite://{work / 'aggregates.db'}") as db:
        specs = frame.check(spark, plan.tables)
        with open_log(log_url) as log:
            start = job.prepare(log, db, plan, specs)
        began = cpu_seconds(group)
        progress = job.run(spark, plan, db, specs, start)
        return cpu_seconds(group) - began, len(progress.batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-batch", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=5000, help="READ_TASK_RECORDS to try")
    args = parser.parse_args()
    group = own_cgroup()
    try:
        measure(args, group)
    finally:
        leave(group)


def measure(args: argparse.Namespace, group: Path) -> None:
    default = args.records
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    spark = session.build_session(Settings(), "bench-read-task-records", master="local[2]")
    ways = {"two read tasks (READ_TASK_RECORDS = 1)": 1, f"one (= {default:,})": default}
    found: dict[str, list[float]] = {name: [] for name in ways}
    ratios = []
    with tempfile.TemporaryDirectory(prefix="exactly-read-tasks-") as work:
        # a first run warms the JVM and starts the Python daemons: not counted
        run(spark, Path(work) / "warm-up", args.per_batch, args.batches, group)
        for round_ in range(args.rounds):
            order = list(ways.items())
            for name, records in order if round_ % 2 == 0 else reversed(order):
                session.READ_TASK_RECORDS = records
                where = Path(work) / f"{round_}-{records}"
                cpu, batches = run(spark, where, args.per_batch, args.batches, group)
                found[name].append(cpu / batches * 1000)
                print(f"round {round_ + 1}, {name}: {batches} micro-batches, {cpu:.1f} CPU s")
            one, two = (found[name][-1] for name in reversed(ways))
            ratios.append(one / two)
    spark.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\nthe aggregate job, micro-batches of {args.per_batch:,} events from 4 partitions")
    print("\n| read | CPU ms per micro-batch (rounds) | median |")
    print("| --- | --- | ---: |")
    for name, runs in found.items():
        listed = ", ".join(f"{ms:,.0f}" for ms in runs)
        print(f"| {name} | {listed} | {statistics.median(runs):,.0f} |")
    listed = ", ".join(f"{ratio:.2f}" for ratio in ratios)
    print(f"\none task / two, per round: {listed} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
