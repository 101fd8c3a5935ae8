"""The lake query with the segment layout, shaped on the driver or on the executors, beside plain
Spark writing the same tables (issue 42's bench: the layout at 0.5 of plain Spark or more).

    .venv/bin/python bench/segment_shaping.py [--events 100000] [--names 30] [--repeat 3]

The events are ``tests/warehouse_events.py``'s SDK-like ones (every call type; analytics.js
context, nested properties and traits, arrays), their tracks spread over ``--names`` event
names, written once into the embedded sqlite log (8 partitions). One SparkSession
(``local[2]``, exactly's settings); each round, in turn, into a fresh directory:

* plain Spark: the topic read by the same source; ``events`` parsed and written as in
  ``bench/lake.py`` (``lake_frame``, ``write.partitionBy("date").parquet``); then the JSON
  parsed once with its schema (inferred before the clock starts: the baseline is given it),
  cached, and per table a ``select`` of its flattened columns written as Parquet: ``tracks``,
  one table per event name, ``identifies``, ``pages``, ``screens``, ``groups``, ``aliases``,
  and ``users`` / ``accounts`` as the newest traits per id (``max_by``). No kinds inferred, no
  rejects, no marker, no transaction: the lower bound of the work;
* ``exactly lake`` with ``layout = "segment"`` on Delta, shaped on the driver (``shaping =
  "driver"``: one Python thread);
* the same, shaped on the executors (``exactly.lake.shaping``).

events/s = events / seconds from the call to its end; medians of ``--repeat`` rounds after a
warm-up round, and each ratio to plain Spark.
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
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.warehouse_events import sdk_event

from exactly.lake.segment.names import event_table, flat_name, leaves
from spark_plain import PARTITIONS, fill  # type: ignore[import-not-found]

WORDS = ("Order", "Product", "Cart", "Checkout", "Coupon", "Promotion", "Video", "Search")
DOINGS = ("Completed", "Viewed", "Added", "Removed", "Started", "Shared", "Clicked")


def make_events(count: int, names: int) -> list[dict[str, Any]]:
    """SDK-like events; the tracks' names cycle through ``names`` names."""
    found = [f"{w} {d}" for d in DOINGS for w in WORDS][:names]
    events = []
    for n in range(count):
        event = sdk_event(n, users=1_000)
        if event["type"] == "track":
            event["event"] = found[n % len(found)]
        events.append(event)
    return events


TABLES = {"identify": "identifies", "page": "pages", "screen": "screens", "group": "groups"}
TABLES["alias"] = "aliases"
SOURCE = {"track": "properties", "page": "properties", "screen": "properties"}
SOURCE |= {"identify": "traits", "group": "traits"}
COMMON = {
    "id": "messageId",
    "anonymous_id": "anonymousId",
    "user_id": "userId",
    "received_at": "receivedAt",
    "sent_at": "sentAt",
    "timestamp": "timestamp",
    "original_timestamp": "originalTimestamp",
}
OWN = {"page": ("name", "category"), "screen": ("name", "category"), "group": ("groupId",)}
OWN["alias"] = ("previousId",)


class Plain:
    """Plain Spark's tables: which leaf paths each table has, from the events (before the
    clock), then the selects and writes (on the clock)."""

    def __init__(self, spark: Any, events: list[dict[str, Any]], file: Path) -> None:
        self.spark = spark
        self.schema = spark.read.json(str(file)).schema
        self.paths: dict[tuple[str, str | None], set[tuple[str, ...]]] = {}
        for event in events:
            key = (event["type"], event.get("event"))
            found = self.paths.setdefault(key, set())
            found.update(("context", *p) for p, _ in leaves(event.get("context") or {}))
            source = SOURCE.get(event["type"])
            if source:
                found.update((source, *p) for p, _ in leaves(event.get(source) or {}))

    def columns(self, kind: str, name: str | None, with_source: bool) -> list[Any]:
        from pyspark.sql import functions as F

        picked = [F.col(f"`{field}`").alias(column) for column, field in COMMON.items()]
        picked += [F.col(f"`{field}`").alias(flat_name([field])) for field in OWN.get(kind, ())]
        picked.append(F.current_timestamp().alias("uuid_ts"))
        paths = sorted(self.paths[(kind, name)])
        for path in paths:
            if path[0] != "context" and not with_source:
                continue
            column = F.col(".".join(f"`{key}`" for key in path))
            if self._is_array(path):
                column = F.to_json(column)
            prefix = [] if path[0] != "context" else ["context"]
            picked.append(column.alias(flat_name([*prefix, *path[1:]])))
        return picked

    def _is_array(self, path: tuple[str, ...]) -> bool:
        from pyspark.sql.types import ArrayType, StructType

        found: Any = self.schema
        for key in path:
            if not isinstance(found, StructType):
                return False
            found = found[key].dataType
        return isinstance(found, ArrayType)

    def write(self, log_url: str, where: Path) -> None:
        from pyspark.sql import functions as F
        from pyspark.sql.window import Window

        from exactly.lake.query import lake_frame

        records = self.spark.read.format("exactly").option("log", log_url)
        records = records.option("topic", "events").load()
        lake_frame(records).write.partitionBy("date").parquet(str(where / "events"))
        parsed = records.select(
            F.from_json(F.col("value").cast("string"), self.schema).alias("e")
        ).select("e.*")
        parsed = parsed.cache()
        for kind, name in sorted(self.paths, key=str):
            rows = parsed.where(F.col("type") == kind)
            if kind == "track":
                rows = rows.where(F.col("event") == name)
                slug = event_table(str(name))
                tracks = [F.lit(slug).alias("event"), F.col("event").alias("event_text")]
                frame = rows.select(*self.columns(kind, name, True), *tracks)
                frame.write.parquet(str(where / str(slug)))
                continue
            table = TABLES[kind]
            rows.select(*self.columns(kind, name, True)).write.parquet(str(where / table))
            if kind in ("identify", "group"):  # users, accounts: the newest traits per id
                key = "userId" if kind == "identify" else "groupId"
                newest = Window.partitionBy(key).orderBy(F.col("timestamp").desc())
                merged = rows.withColumn("n", F.row_number().over(newest)).where("n = 1")
                merged.select(*self.columns(kind, name, True)).write.parquet(
                    str(where / ("users" if kind == "identify" else "accounts"))
                )
        tracks = parsed.where(F.col("type") == "track")
        first = next(name for kind, name in self.paths if kind == "track")
        tracks.select(*self.columns("track", first, False), F.col("event")).write.parquet(
            str(where / "tracks")
        )
        parsed.unpersist()


class Clock:
    """Seconds spent in each step of 4b (shaping, commits), summed over a run's batches, and
    the CPU seconds of the driver's thread in them."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, owner: Any, name: str, step: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began, cpu = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[step] = self.spent.get(step, 0.0) + time.perf_counter() - began
                cpu = time.thread_time() - cpu  # the driver's own thread: what holds its GIL
                self.spent[f"{step} cpu"] = self.spent.get(f"{step} cpu", 0.0) + cpu

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


class Runs:
    def __init__(self, spark: Any, work: Path, log_url: str, plain: Plain) -> None:
        from exactly.lake import shaping
        from exactly.lake.warehouse import Warehouse

        self.spark, self.work, self.log_url, self.plain_tables = spark, work, log_url, plain
        self.runs = 0
        self.clock = Clock()
        self.clock.wrap(Warehouse, "shape", "shaping")
        self.clock.wrap(shaping, "shape_batch", "shaping")
        self.clock.wrap(Warehouse, "commit", "commits")

    def _fresh(self, name: str) -> Path:
        self.runs += 1
        return self.work / f"{name}-{self.runs}"

    def plain(self) -> float:
        where = self._fresh("plain")
        began = time.perf_counter()
        self.plain_tables.write(self.log_url, where)
        return time.perf_counter() - began

    def lake(self, shaping: str) -> float:
        from exactly.lake import open_table
        from exactly.lake.query import LakePlan, run

        where = self._fresh(f"lake-{shaping}")
        with open_table(f"delta://{where / 'events'}") as table:
            plan = LakePlan(
                self.log_url,
                table.url,
                where / "checkpoint",
                until_caught_up=True,
                layout="segment",
                shaping=shaping,
            )
            began = time.perf_counter()
            run(self.spark, plan, table)
            return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--names", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="plain,driver,executors")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(scratch)
        from exactly.config import Settings
        from exactly.spark.session import build_session

        load = Path("/proc/loadavg").read_text().split()[:3]
        log_url = f"sqlite://{work / 'log'}"
        events = make_events(args.events, args.names)
        fill(log_url, [orjson.dumps(e) for e in events], work / "events.jsonl")
        spark = build_session(Settings(data_dir=work / "spark"), "bench-shaping", master="local[2]")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        runs = Runs(spark, work, log_url, Plain(spark, events, work / "events.jsonl"))
        jobs: dict[str, Callable[[], float]] = {
            "plain": runs.plain,
            "driver": lambda: runs.lake("driver"),
            "executors": lambda: runs.lake("executors"),
        }
        names = {
            "plain": "plain Spark: events + the same tables as Parquet",
            "driver": "exactly lake, segment, shaped on the driver",
            "executors": "exactly lake, segment, shaped on the executors",
        }
        order = [job for job in args.only.split(",") if job in jobs]
        rates: dict[str, list[float]] = {job: [] for job in order}
        steps: dict[str, list[dict[str, float]]] = {job: [] for job in order}
        for r in range(args.repeat + 1):
            for job in order:
                rate = args.events / jobs[job]()
                spent = runs.clock.take()
                split = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in spent.items())
                print(f"round {r}: {names[job]} {rate:,.0f} events/s ({split})", flush=True)
                if r:  # round 0 warms the JVM and the Python workers up
                    rates[job].append(rate)
                    steps[job].append(spent)
        spark.stop()
        after = Path("/proc/loadavg").read_text().split()[:3]
    median = {job: statistics.median(found) for job, found in rates.items()}
    base = median.get("plain")
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average (1, 5, 15 min): {' '.join(load)} before, {' '.join(after)} after")
    print(
        f"{args.events:,} events ({args.names} track names) in {PARTITIONS} partitions; "
        f"medians of {args.repeat} rounds"
    )
    print("| job | runs (events/s) | median | / plain | 4b shaping: wall / driver CPU (s) |")
    print("| --- | --- | ---: | ---: | --- |")
    for job, found in rates.items():
        text = ", ".join(f"{rate:,.0f}" for rate in found)
        ratio = f"{median[job] / base:.2f}" if base else "-"
        spent = [
            f"{statistics.median(s.get(step, 0.0) for s in steps[job]):.1f}"
            for step in ("shaping", "shaping cpu")
        ]
        split = " / ".join(spent) if job != "plain" else "-"
        print(f"| {names[job]} | {text} | {median[job]:,.0f} | {ratio} | {split} |")


if __name__ == "__main__":
    main()
