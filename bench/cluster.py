"""The dedupe job on a standalone Spark cluster: 1 worker against 2 workers, same input, one run.

    .venv/bin/python bench/cluster.py [--events 400000] [--per-trigger 100000] [--rounds 1]

One ``raw`` topic of 8 partitions on the sqlite log is filled once (UUID messageIds, about 300
bytes an event); then, in each round, for 1 worker and for 2 workers (1 core, 1 GB each, a
master and workers from the installed PySpark, started fresh for each run), the dedupe job
(``exactly dedupe``'s query, Trigger.AvailableNow, the redis store on one ``redis-server``, a
fresh namespace, output topic and checkpoint each) reads all of it. Printed: events/s with
start-up and steady (the micro-batches after the first), per run, and the ratio of the medians
2 workers / 1 worker. The driver runs in a child process of its own per run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.events import partition_for
from exactly.log import Record, open_log

PARTITIONS = 8


def fill_raw(log_url: str, events: int) -> None:
    rng = random.Random(3)
    pad = "x" * 200
    with open_log(log_url) as log:
        log.create_topic("raw", PARTITIONS, exist_ok=True)
        pending: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        for n in range(events):
            message_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            value = orjson.dumps(
                {"messageId": message_id, "type": "track", "event": "Bench", "n": n, "p": pad}
                | {"sourceId": "web"}
            )
            pending[partition_for(message_id, PARTITIONS)].append(
                Record(value, key=message_id.encode())
            )
            if n % 50_000 == 49_999:
                log.append_many("raw", pending)
                pending = {p: [] for p in range(PARTITIONS)}
        log.append_many("raw", pending)


def job(
    master: str, log_url: str, data_dir: Path, store: str, output: str, per_trigger: int
) -> dict[str, Any]:
    """One dedupe job on ``master`` (a child process's whole life)."""
    from exactly.config import Settings
    from exactly.dedupe.job import DedupePlan, prepare, run
    from exactly.dedupe.window import Bounds
    from exactly.spark.session import build_session

    spark = build_session(Settings(data_dir=data_dir), "exactly-bench-cluster", master=master)
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    plan = DedupePlan(
        log_url,
        store,
        data_dir,
        data_dir / "checkpoint",
        output=output,
        bounds=Bounds(window=7 * 86_400_000),
        until_caught_up=True,
        max_records_per_trigger=per_trigger,
        read_records=10_000,
    )
    with open_log(log_url) as log:
        partitions = prepare(log, plan)
        began = time.perf_counter()
        progress = run(spark, plan, partitions)
        elapsed = time.perf_counter() - began
        passed = sum(log.end_offsets(plan.output).values())
        read = sum(log.end_offsets("raw").values())
    spark.stop()
    batches = [progress.batches[b] for b in sorted(progress.batches)]
    steady = [b for b in batches[1:] if int(b.get("numInputRows", 0))]
    steady_rows = sum(int(b["numInputRows"]) for b in steady)
    steady_seconds = sum(int(b["durationMs"]["triggerExecution"]) for b in steady) / 1000
    return {
        "events": read,
        "passed": passed,
        "seconds": elapsed,
        "events_per_s": read / elapsed,
        "steady_per_s": steady_rows / steady_seconds if steady_seconds else float("nan"),
        "batches": len(batches),
    }


def one_run(
    workers: int, root: Path, n: int, log_url: str, redis_url: str, per_trigger: int
) -> dict[str, Any]:
    from tests.spark_cluster import SparkCluster

    store = f"{redis_url}?namespace=bench-cluster-{uuid.uuid4().hex[:8]}"
    with SparkCluster(root / f"cluster-{n}", workers=workers) as cluster:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one-job",
                cluster.url,
                log_url,
                str(root / f"data-{n}"),
                store,
                f"events-{n}",
                "--per-trigger",
                str(per_trigger),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
            check=False,
        )
        if child.returncode != 0:
            raise SystemExit(f"the job failed:\n{child.stderr[-3000:]}")
        found: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
        found["workers"] = workers
        found["tasks"] = [cluster.tasks_run(i) for i in range(workers)]
        found["load"] = os.getloadavg()[0]
        return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--per-trigger", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--one-job", nargs=5, metavar=("MASTER", "LOG", "DIR", "STORE", "OUT"))
    args = parser.parse_args()
    if args.one_job:
        master, log_url, data_dir, store, output = args.one_job
        print(json.dumps(job(master, log_url, Path(data_dir), store, output, args.per_trigger)))
        return
    from tests.servers import RedisServer

    root = Path(tempfile.mkdtemp(prefix="exactly-bench-cluster-"))
    try:
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
        print(f"load average at start: {os.getloadavg()}")
        log_url = f"sqlite://{root / 'log'}"
        began = time.perf_counter()
        fill_raw(log_url, args.events)
        print(f"raw filled with {args.events:,} events in {time.perf_counter() - began:.0f} s")
        results: list[dict[str, Any]] = []
        with RedisServer() as redis:
            n = 0
            for _ in range(args.rounds):
                for workers in (1, 2):
                    results.append(one_run(workers, root, n, log_url, redis.url, args.per_trigger))
                    n += 1
        print(
            "\n| workers | events | passed | seconds | events/s | steady events/s | batches "
            "| tasks per worker | load |"
        )
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for r in results:
            print(
                f"| {r['workers']} | {r['events']:,} | {r['passed']:,} | {r['seconds']:.0f} | "
                f"{r['events_per_s']:,.0f} | {r['steady_per_s']:,.0f} | {r['batches']} | "
                f"{', '.join(map(str, r['tasks']))} | {r['load']:.1f} |"
            )
        for measure in ("events_per_s", "steady_per_s"):
            one = statistics.median(r[measure] for r in results if r["workers"] == 1)
            two = statistics.median(r[measure] for r in results if r["workers"] == 2)
            print(f"{measure}: 2 workers / 1 worker = {two / one:.2f}")
        print(f"load average at end: {os.getloadavg()}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
