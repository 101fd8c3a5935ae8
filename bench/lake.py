"""The lake query beside a plain Spark batch write of the same events, and optimize's effect.

    .venv/bin/python bench/lake.py [--events 200000] [--repeat 3] [--table delta|iceberg]
    .venv/bin/python bench/lake.py files [--commits 2000] [--per-commit 50] [--repeat 5]

The default run writes the events (JSON as ``events`` holds them, 8 partitions) into the
embedded sqlite log once; then, in one SparkSession (``local[2]``, exactly's settings), round
after round, in turn:

* plain Spark: the same topic read by the same source, parsed into the same columns
  (:func:`exactly.lake.query.lake_frame`) and written with ``write.partitionBy("date").parquet``
  in one batch job: no marker, no transaction, no guarantee;
* ``exactly lake``'s query (Trigger.AvailableNow, its default 50,000 records per micro-batch)
  into a fresh table, each micro-batch committed with its marker.

events/s = events / seconds from the call to its end; medians of ``--repeat`` rounds after a
warm-up round, and the ratio (issue 35's target: the lake query at 0.7 of plain Spark or more).

``files`` measures small files: a table of ``--commits`` commits of ``--per-commit`` events each
(as a day of 1-second micro-batches leaves, at a smaller scale; no Spark), a full count query
over it with DuckDB (``exactly lake sql``) before and after ``optimize``, beside the same rows
written in one commit (issue 35's target: after optimize, at most 2x the fresh table's time).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exactly.lake import open_table
from exactly.lake.base import Marker
from spark_plain import PARTITIONS, fill, make_events  # type: ignore[import-not-found]


def table_url(kind: str, where: Path) -> str:
    return f"delta://{where / 'events'}" if kind == "delta" else f"iceberg://{where}"


class Runs:
    def __init__(self, spark: object, work: Path, log_url: str, kind: str) -> None:
        self.spark, self.work, self.log_url, self.kind = spark, work, log_url, kind
        self.runs = 0

    def _fresh(self, name: str) -> Path:
        self.runs += 1
        return self.work / f"{name}-{self.runs}"

    def plain(self) -> float:
        from exactly.lake.query import lake_frame

        began = time.perf_counter()
        records = (
            self.spark.read.format("exactly")  # type: ignore[attr-defined]
            .option("log", self.log_url)
            .option("topic", "events")
            .load()
        )
        lake_frame(records).write.partitionBy("date").parquet(str(self._fresh("plain")))
        return time.perf_counter() - began

    def lake(self) -> float:
        from exactly.lake.query import LakePlan, run

        where = self._fresh("lake")
        with open_table(table_url(self.kind, where)) as table:
            plan = LakePlan(self.log_url, table.url, where / "checkpoint", until_caught_up=True)
            began = time.perf_counter()
            run(self.spark, plan, table)  # type: ignore[arg-type]
            return time.perf_counter() - began


def query_seconds(url: str, repeat: int) -> float:
    """The median time of a full count over the table's current version (DuckDB, as ``exactly
    lake sql`` runs it), the table opened afresh each time."""
    from exactly.lake.sql import query

    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        with open_table(url) as table:
            query(table, "select count(*), count(distinct messageId) from events")
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def small_files(args: argparse.Namespace, work: Path) -> None:
    from exactly.lake.columns import event_rows

    events = make_events(args.commits * args.per_commit)
    many, one = table_url(args.table, work / "many"), table_url(args.table, work / "one")
    began = time.perf_counter()
    with open_table(many) as table:
        for n in range(args.commits):
            rows = event_rows(events[n * args.per_commit : (n + 1) * args.per_commit])
            table.append(rows, Marker("bench", n))
    print(f"{args.commits:,} commits written in {time.perf_counter() - began:.1f} s", flush=True)
    with open_table(one) as table:
        table.append(event_rows(events), Marker("bench", 0))
    fresh = query_seconds(one, args.repeat)
    before = query_seconds(many, args.repeat)
    began = time.perf_counter()
    with open_table(many) as table:
        done = table.optimize()
    compacted = time.perf_counter() - began
    after = query_seconds(many, args.repeat)
    load = os.getloadavg()[0]
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} after")
    print(
        f"{args.table}: {args.commits:,} commits of {args.per_commit} events; "
        f"optimize: {done.files_removed:,} files into {done.files_added:,} in {compacted:.1f} s"
    )
    print("| table | count query (median s) | / fresh |")
    print("| --- | ---: | ---: |")
    for name, seconds in (
        ("written in one commit (fresh)", fresh),
        (f"{args.commits:,} small commits", before),
        ("the same after optimize", after),
    ):
        print(f"| {name} | {seconds:.3f} | {seconds / fresh:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["query", "files"], default="query")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--table", choices=["delta", "iceberg"], default="delta")
    parser.add_argument("--commits", type=int, default=2_000)
    parser.add_argument("--per-commit", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(scratch)
        if args.what == "files":
            small_files(args, work)
            return
        from exactly.config import Settings
        from exactly.spark.session import build_session

        load = os.getloadavg()[0]
        log_url = f"sqlite://{work / 'log'}"
        fill(log_url, make_events(args.events), work / "events.jsonl")
        spark = build_session(Settings(data_dir=work / "spark"), "bench-lake", master="local[2]")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        runs = Runs(spark, work, log_url, args.table)
        order: dict[str, Callable[[], float]] = {
            "plain Spark: read, parse, write.parquet": runs.plain,
            f"exactly lake ({args.table})": runs.lake,
        }
        rates: dict[str, list[float]] = {name: [] for name in order}
        for r in range(args.repeat + 1):
            for name, measure in order.items():
                rate = args.events / measure()
                print(f"round {r}: {name} {rate:,.0f} events/s", flush=True)
                if r:  # round 0 warms the JVM up
                    rates[name].append(rate)
        spark.stop()
    median = {name: statistics.median(found) for name, found in rates.items()}
    plain = median[next(iter(order))]
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} before")
    print(f"{args.events:,} events in {PARTITIONS} partitions; medians of {args.repeat} rounds")
    print("| job | runs (events/s) | median | / plain |")
    print("| --- | --- | ---: | ---: |")
    for name, found in rates.items():
        runs_text = ", ".join(f"{rate:,.0f}" for rate in found)
        print(f"| {name} | {runs_text} | {median[name]:,.0f} | {median[name] / plain:.2f} |")


if __name__ == "__main__":
    main()
