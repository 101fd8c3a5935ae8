"""Append and read throughput of the log backends, beside a plain-SQLite baseline run alongside.

    .venv/bin/python bench/log_throughput.py [--backend sqlite|kafka|all] [--repeat 3]

300-byte records. Appends: batches of 1, 100 and 1000 from 1 and 4 processes; single-record
appends from 8 concurrent writers (threads of one process, then 8 processes). Reads: one process
reading every partition in batches of 5000. The baseline is what SQLite itself does with the same
durability: ``executemany`` + ``COMMIT`` in WAL mode with ``synchronous=FULL``, one process.
Each figure is the median of ``--repeat`` runs; prints a markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.log import Record, open_log

VALUE = b"x" * 300
PARTITIONS = 8


def appender(url: str, topic: str, worker: int, batch: int, batches: int, start: float) -> None:
    with open_log(url) as log:
        records = [Record(VALUE)] * batch
        while time.time() < start:
            time.sleep(0.001)
        for n in range(batches):
            log.append(topic, (worker + n) % PARTITIONS, records)


def run_processes(url: str, topic: str, procs: int, batch: int, batches: int) -> float:
    """Seconds for ``procs`` processes to append ``batches`` batches each, from a common start."""
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0  # all spawned and connected before the clock starts
    workers = [
        ctx.Process(target=appender, args=(url, topic, w, batch, batches, start))
        for w in range(procs)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    return time.time() - start


def in_process(url: str, topic: str, batch: int, batches: int) -> float:
    """Seconds to append ``batches`` batches in this process, measured like the baseline."""
    records = [Record(VALUE)] * batch
    with open_log(url) as log:
        began = time.perf_counter()
        for n in range(batches):
            log.append(topic, n % PARTITIONS, records)
        return time.perf_counter() - began


def run_threads(url: str, topic: str, threads: int, appends: int) -> float:
    with open_log(url) as log:

        def one(worker: int) -> None:
            for n in range(appends):
                log.append(topic, (worker + n) % PARTITIONS, [Record(VALUE)])

        log.append(topic, 0, [Record(VALUE)])  # open the writer before timing
        began = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(threads)))
        return time.perf_counter() - began


def read_all(url: str, topic: str) -> tuple[int, float]:
    with open_log(url) as log:
        began = time.perf_counter()
        count = 0
        for partition in range(PARTITIONS):
            offset = 0
            while batch := log.read(topic, partition, offset, max_records=5000):
                count += len(batch)
                offset = batch[-1].offset + 1
        return count, time.perf_counter() - began


def baseline(directory: Path, batch: int, batches: int) -> float:
    path = directory / f"baseline-{uuid.uuid4().hex}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, ts INTEGER, key BLOB, value BLOB)")
    rows = [(None, 0, None, VALUE)] * batch
    began = time.perf_counter()
    for _ in range(batches):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO r VALUES (?, ?, ?, ?)", rows)
        conn.execute("COMMIT")
    seconds = time.perf_counter() - began
    conn.close()
    return seconds


def median_rate(repeat: int, records: int, measure: Callable[[], float]) -> float:
    return statistics.median(records / measure() for _ in range(repeat))


def bench_backend(
    name: str, url_for: Callable[[], str], repeat: int, rows: list[list[str]], scratch: Path
) -> None:
    def fresh() -> tuple[str, str]:
        url = url_for()
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        with open_log(url) as log:
            log.create_topic(topic, PARTITIONS)
        return url, topic

    ratios = []
    for _ in range(repeat):  # the baseline and the log in alternation, so both see the same load
        base = 100 * 1000 / baseline(scratch, 1000, 100)
        ours = 100 * 1000 / in_process(*fresh(), 1000, 100)
        ratios.append(ours / base)
    rows.append(
        [
            name,
            "append, batch 1000, 1 process: ratio to the baseline (paired runs)",
            f"{statistics.median(ratios):.2f}",
        ]
    )
    print(rows[-1], flush=True)

    plan = [(1, 1, 1000), (1, 100, 200), (1, 1000, 100), (4, 1, 500), (4, 100, 100), (4, 1000, 50)]
    for procs, batch, batches in plan:

        def measure(procs: int = procs, batch: int = batch, batches: int = batches) -> float:
            return run_processes(*fresh(), procs, batch, batches)

        rate = median_rate(repeat, procs * batch * batches, measure)
        rows.append([name, f"append, batch {batch}, {procs} process(es)", f"{rate:,.0f}"])
        print(rows[-1], flush=True)

    rate = median_rate(repeat, 8 * 500, lambda: run_threads(*fresh(), 8, 500))
    rows.append([name, "append, batch 1, 8 threads (one process)", f"{rate:,.0f}"])
    print(rows[-1], flush=True)
    rate = median_rate(repeat, 8 * 500, lambda: run_processes(*fresh(), 8, 1, 500))
    rows.append([name, "append, batch 1, 8 processes", f"{rate:,.0f}"])
    print(rows[-1], flush=True)

    url, topic = fresh()
    run_processes(url, topic, 1, 1000, 200)
    rates = []
    for _ in range(repeat):
        count, seconds = read_all(url, topic)
        rates.append(count / seconds)
    rows.append(
        [name, f"read, batches of 5000 ({count:,} records)", f"{statistics.median(rates):,.0f}"]
    )
    print(rows[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["sqlite", "kafka", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        directory = Path(scratch)
        rate = median_rate(args.repeat, 100 * 1000, lambda: baseline(directory, 1000, 100))
        rows.append(["baseline", "plain sqlite executemany + commit, batch 1000", f"{rate:,.0f}"])
        rate = median_rate(args.repeat, 1000, lambda: baseline(directory, 1, 1000))
        rows.append(["baseline", "plain sqlite insert + commit, batch 1", f"{rate:,.0f}"])
        print(rows[-2:], flush=True)
        if args.backend in ("sqlite", "all"):
            bench_backend(
                "sqlite",
                lambda: f"sqlite://{directory / uuid.uuid4().hex}",
                args.repeat,
                rows,
                directory,
            )
        if args.backend in ("kafka", "all"):
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tests.servers import TansuBroker

            with TansuBroker() as broker:
                bench_backend("kafka (Tansu)", lambda: broker.url, args.repeat, rows, directory)
    print()
    cores, python = os.cpu_count(), platform.python_version()
    print(f"machine: {platform.platform()}, {cores} cores, Python {python}")
    print("| backend | workload | records/s (median) or ratio |")
    print("| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
