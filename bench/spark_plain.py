"""The dedupe and aggregate jobs beside plain Spark batch jobs doing the same work, in one run.

    .venv/bin/python bench/spark_plain.py [--events 400000] [--repeat 3]

The same events (JSON as the collector stores them, 1% repeated messageIds, four sources) are
written once as a JSON-lines file and once into the embedded sqlite log (``raw`` and ``events``,
8 partitions, keyed by messageId; ``events`` with the two headers the dedupe job writes). One
SparkSession (``local[2]``, exactly's settings); each round, in turn:

* plain dedupe: ``spark.read.schema(...).json(file).dropDuplicates(["sourceId", "messageId"])``
  written as JSON lines (no guarantees);
* ``exactly dedupe``'s query (rocksdb store, Trigger.AvailableNow) from ``raw`` to a fresh topic;
* plain aggregate: the same file, ``groupBy`` source, type, event and minute, ``count``, written
  as JSON lines;
* ``exactly aggregate``'s query (the event counts table into a fresh SQLite file) over
  ``events``.

Each is timed from the call to its end (the jobs' one-off preparation, such as creating topics,
outside the clock); events/s = events / seconds. Medians of ``--repeat`` rounds after one warm-up
round; prints a markdown table with the ratios. ``--compare-headers`` runs only the aggregate
job, alternating a source that reads the headers column (as before the jobs set
``headers=false``) with one that does not; ``--compare-fields`` only the aggregate job,
alternating ``from_json`` over every event (as before) with the source reading the event counts'
fields in Arrow (``exactly.events.fields``); ``--compare-trips`` only the dedupe job, alternating
its claims in a ``mapInArrow`` before the sink (as before) with its claims in the sink's worker.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.events import partition_for
from exactly.log import Record, open_log

PARTITIONS = 8
SINK = ("exactly.sink", b"0b9a3c5e-8d2f-4e1a-9c7b-6d5e4f3a2b1c 12 0 345")
SOURCES = ("web", "ios", "android", "server")
EVENT_SCHEMA = (
    "messageId string, type string, event string, userId string, sourceId string, "
    "timestamp timestamp, receivedAt timestamp, properties struct<n: bigint>"
)


def make_events(count: int) -> list[bytes]:
    rng = random.Random(3)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]
    for n in range(0, count, 100):  # 1% repeats of an earlier id from the same source
        ids[n] = ids[rng.randrange(n)] if n else ids[n]
    start = time.time() - 3_600
    events = []
    for n, message_id in enumerate(ids):
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(start + n / 200))
        events.append(
            orjson.dumps(
                {
                    "messageId": message_id,
                    "type": "track",
                    "event": ("Viewed", "Clicked", "Bought")[n % 3],
                    "userId": f"u{n % 5000}",
                    "properties": {"n": n},
                    "timestamp": stamp,
                    "receivedAt": stamp,
                    "sourceId": SOURCES[int(message_id[0], 16) % len(SOURCES)],
                }
            )
        )
    return events


def fill(log_url: str, events: list[bytes], file: Path) -> None:
    file.write_bytes(b"\n".join(events) + b"\n")
    with open_log(log_url) as log:
        for topic in ("raw", "events"):
            log.create_topic(topic, PARTITIONS)
            pending: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
            for n, value in enumerate(events):
                message_id = orjson.loads(value)["messageId"]
                partition = partition_for(message_id, PARTITIONS)
                # events carry the two headers the dedupe job and its sink add; raw has none
                marks = () if topic == "raw" else (("exactly.source.offset", b"%d" % n), SINK)
                pending[partition].append(Record(value, key=message_id.encode(), headers=marks))
            for partition, records in pending.items():
                for at in range(0, len(records), 10_000):
                    log.append(topic, partition, records[at : at + 10_000])


class Jobs:
    def __init__(self, spark: object, work: Path, log_url: str, file: Path) -> None:
        self.spark, self.work, self.log_url, self.file = spark, work, log_url, file
        self.runs = 0

    def _fresh(self, name: str) -> Path:
        self.runs += 1
        return self.work / f"{name}-{self.runs}"

    def plain_dedupe(self) -> float:
        began = time.perf_counter()
        frame = self.spark.read.schema(EVENT_SCHEMA).json(str(self.file))  # type: ignore[attr-defined]
        deduped = frame.dropDuplicates(["sourceId", "messageId"])
        deduped.write.mode("overwrite").json(str(self._fresh("plain-dedupe")))
        return time.perf_counter() - began

    def plain_aggregate(self) -> float:
        from pyspark.sql import functions as F

        began = time.perf_counter()
        frame = self.spark.read.schema(EVENT_SCHEMA).json(str(self.file))  # type: ignore[attr-defined]
        minute = F.date_trunc("minute", F.coalesce("timestamp", "receivedAt")).alias("minute")
        counts = frame.groupBy("sourceId", "type", "event", minute).count()
        counts.write.mode("overwrite").json(str(self._fresh("plain-aggregate")))
        return time.perf_counter() - began

    def dedupe(self, two_trips: bool = False) -> float:
        """``exactly dedupe``'s query; ``two_trips``: its claims in a ``mapInArrow`` before the
        sink (as before they ran in the sink's own Python worker)."""
        from exactly.dedupe.job import DedupePlan, prepare, run
        from exactly.dedupe.window import Bounds

        data = self._fresh("dedupe")
        plan = DedupePlan(
            self.log_url,
            f"rocksdb://{data / 'store'}",
            data,
            data / "checkpoint",
            output=f"deduped-{self.runs}",
            bounds=Bounds(window=7 * 86_400_000),
            until_caught_up=True,
        )
        with open_log(self.log_url) as log:
            partitions = prepare(log, plan)
        began = time.perf_counter()
        if two_trips:
            self._dedupe_in_two_trips(plan)
        else:
            run(self.spark, plan, partitions)  # type: ignore[arg-type]
        return time.perf_counter() - began

    def _dedupe_in_two_trips(self, plan: Any) -> None:
        from exactly.dedupe.job import SCHEMA
        from exactly.dedupe.task import TaskPlan, dedupe_partition
        from exactly.spark.session import read_tasks
        from exactly.spark.streaming import run_query

        raw = (
            self.spark.readStream.format("exactly")  # type: ignore[attr-defined]
            .option("log", plan.log_url)
            .option("topic", plan.source)
            .option("readRecords", str(plan.read_records))
            .option("readTasks", str(read_tasks(self.spark)))  # type: ignore[arg-type]
            .load()
        )
        task = TaskPlan(plan.log_url, plan.source, plan.output, plan.rejected, plan.open_store())
        rows = raw.mapInArrow(partial(dedupe_partition, task), SCHEMA).drop("offset")
        writer = (
            rows.writeStream.format("exactly")
            .option("log", plan.log_url)
            .option("topic", plan.output)
            .option("checkpointLocation", str(plan.checkpoint))
        )
        run_query(writer, until_caught_up=True, trigger_seconds=1.0, on_batch=None)

    def aggregate(self, headers: bool = False, fields: bool = True) -> float:
        """``exactly aggregate``'s query; ``headers``: the source reads the headers column too
        (as it did before the jobs set ``headers=false``); ``fields=False``: ``from_json`` parses
        every event (as before the source read the event counts' fields in Arrow)."""
        from exactly.aggregate import frame, job, open_db
        from exactly.errors import AggregateError
        from exactly.spark.batches import run_batches

        data = self._fresh("aggregate")
        plan = job.AggregatePlan(self.log_url, data / "checkpoint", until_caught_up=True)
        specs = frame.check(self.spark, plan.tables)  # type: ignore[arg-type]
        columns, options = job.source_reading(specs if fields else [])
        columns += ["headers"] if headers else []
        with open_db(f"sqlite://{data / 'counts.db'}") as db, open_log(self.log_url) as log:
            start = job.prepare(log, db, plan, specs)
            counter = job.BatchCounter(db, plan, specs)
            began = time.perf_counter()
            run_batches(
                self.spark,  # type: ignore[arg-type]
                "aggregate",
                plan,
                counter,
                columns,
                start=start,
                failed=AggregateError,
                options=options,
            )
            return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--compare-headers",
        action="store_true",
        help="only the aggregate job, its source reading the headers column and not",
    )
    parser.add_argument(
        "--compare-fields",
        action="store_true",
        help="only the aggregate job, from_json parsing every event and the source's fields",
    )
    parser.add_argument(
        "--compare-trips",
        action="store_true",
        help="only the dedupe job, its claims in a mapInArrow before the sink and in the sink",
    )
    args = parser.parse_args()
    from exactly.config import Settings
    from exactly.spark.session import build_session

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        work = Path(scratch)
        log_url = f"sqlite://{work / 'log'}"
        fill(log_url, make_events(args.events), work / "events.jsonl")
        spark = build_session(Settings(data_dir=work / "spark"), "bench-plain", master="local[2]")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
        jobs = Jobs(spark, work, log_url, work / "events.jsonl")
        order: dict[str, Callable[[], float]] = {
            "plain Spark: read JSON, dropDuplicates, write": jobs.plain_dedupe,
            "exactly dedupe (rocksdb)": jobs.dedupe,
            "plain Spark: read JSON, groupBy + count, write": jobs.plain_aggregate,
            "exactly aggregate (SQLite)": jobs.aggregate,
        }
        if args.compare_headers:
            order = {
                "exactly aggregate, the source reading headers (before)": lambda: jobs.aggregate(
                    headers=True
                ),
                "exactly aggregate, headers=false (now)": jobs.aggregate,
            }
        if args.compare_fields:
            order = {
                "exactly aggregate, from_json for every event (before)": lambda: jobs.aggregate(
                    fields=False
                ),
                "exactly aggregate, the source's fields in Arrow (now)": jobs.aggregate,
            }
        if args.compare_trips:
            order = {
                "exactly dedupe, claims in a mapInArrow (before)": lambda: jobs.dedupe(
                    two_trips=True
                ),
                "exactly dedupe, claims in the sink's worker (now)": jobs.dedupe,
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
    names = list(order)
    print()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.2f} before")
    print(f"{args.events:,} events; medians of {args.repeat} rounds after a warm-up round")
    print("| job | runs (events/s) | median | / the first of its pair |")
    print("| --- | --- | ---: | ---: |")
    for name in names:
        runs = ", ".join(f"{x:,.0f}" for x in rates[name])
        plain = median[names[names.index(name) // 2 * 2]]  # each job follows its plain Spark
        print(f"| {name} | {runs} | {median[name]:,.0f} | {median[name] / plain:.2f} |")


if __name__ == "__main__":
    main()
