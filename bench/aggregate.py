"""Aggregate throughput per backend, and the whole pipeline's end-to-end rate and latency.

    .venv/bin/python bench/aggregate.py [--events 600000] [--per-batch 150000] [--repeat 3]
                                        [--e2e-rate 20000] [--e2e-seconds 60] [--skip-e2e]

(a) **Job**: events/s through the aggregate job (``exactly aggregate``'s query, foreachBatch,
Trigger.AvailableNow, ``local[2]``, one Spark session) over an ``events`` topic of 4 partitions
on the embedded sqlite log (the demo's events, ~300 B). Per repeat, in turn: SQLite, PostgreSQL
(127.0.0.1:5432, a fresh schema) and a baseline that computes the same aggregates but commits
nothing (the SQL transaction's price shows as the ratio), each with a fresh checkpoint and
database. Steady state = the micro-batches after the first. Medians of the repeats, and the
median seconds from one micro-batch to the next (with ``--per-batch 2000``: a batch's fixed cost).

(b) **End to end**: ``exactly collect``, ``exactly dedupe`` and ``exactly aggregate`` running
together as separate processes on one data dir (1 s triggers), clients sending ``--e2e-rate``
events/s through ``/v1/batch`` for ``--e2e-seconds``. The aggregate table is polled every 0.1 s.
Latency of the k-th event = when the table's total count first reached k, minus when the batch
holding the k-th event was sent (FIFO by count: each event's own moment of visibility is not
observable in an aggregate); sustained rate = events / (last visible - first sent); p50 and p99
also per 10 s of sending (the first seconds include the jobs' JIT warm-up), and the CPU of each
part while the clients send. ``BENCH_KEEP=1``
keeps the work directory (the jobs' stderr is in it).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.aggregate import AggregateDB, Batch, frame, job, open_db
from exactly.aggregate.spec import TableSpec
from exactly.config import Settings
from exactly.demo import SOURCES, collector_answers, free_port, generate_events, send
from exactly.errors import ExactlyError
from exactly.events import partition_for
from exactly.log import Record, open_log

PARTITIONS = 4
POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


class NoCommit:
    """The baseline's database: the batch is aggregated and collected, nothing is written."""

    def __init__(self, inner: AggregateDB) -> None:
        self.inner = inner

    def commit(self, batch: Batch, specs: list[TableSpec]) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Collector:
    """``exactly collect`` in a subprocess on a free port, stopped with SIGTERM (drains first)."""

    def __init__(self, settings: Settings, partitions: int) -> None:
        self.port = free_port()
        args = [sys.executable, "-m", "exactly", "--data-dir", str(settings.data_dir)]
        args += ["collect", "--port", str(self.port)]
        args += ["--partitions", str(partitions)]
        env = {  # not in argv: ps shows argv
            **os.environ,
            "EXACTLY_LOG__URL": settings.log_url,
            "EXACTLY_COLLECTOR__SOURCES": ",".join(f"{n}={k}" for n, k in SOURCES.items()),
        }
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env
        )
        deadline = time.monotonic() + 60
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                error = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.stop()
                raise ExactlyError(f"the collector did not start: {error.strip()[-300:]}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        return collector_answers(self.port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def fill(log_url: str, count: int) -> None:
    import random

    rng = random.Random(1)
    now = time.time()
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        parts: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        for n, event in enumerate(generate_events(count, rng, now)):
            event["sourceId"] = "web" if n % 3 else "ios"
            event["receivedAt"] = event["timestamp"]
            message_id = event["messageId"]
            parts[partition_for(message_id, PARTITIONS)].append(
                Record(json.dumps(event).encode(), key=message_id.encode())
            )
        for partition, records in parts.items():
            for at in range(0, len(records), 5000):
                log.append("events", partition, records[at : at + 5000])


def postgres_url(schema: str) -> str:
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        connection.execute(f"CREATE SCHEMA {schema}")
    return f"{POSTGRES}?options=-csearch_path%3D{schema}"


def job_rate(
    spark: Any, log_url: str, db: Any, checkpoint: Path, per_batch: int
) -> tuple[float, float]:
    """Steady-state events/s of one run (the batches after the first), and the median seconds
    between two micro-batches (with small batches: the fixed cost of one)."""
    plan = job.AggregatePlan(
        log_url, checkpoint, until_caught_up=True, max_records_per_trigger=per_batch
    )
    specs = frame.check(spark, plan.tables)
    with open_log(log_url) as log:
        start = job.prepare(log, db, plan, specs)
    marks: list[tuple[float, int]] = []
    job.run(
        spark,
        plan,
        db,
        specs,
        start,
        lambda _b, events, _c: marks.append((time.perf_counter(), events)),
    )
    steady = marks[1:]
    events = sum(n for _, n in steady)
    gaps = [b[0] - a[0] for a, b in zip(marks, steady, strict=False)]
    return events / (steady[-1][0] - marks[0][0]), statistics.median(gaps)


def bench_job(args: argparse.Namespace, work: Path) -> list[str]:
    from exactly.spark.session import build_session

    log_url = f"sqlite://{work / 'log'}"
    fill(log_url, args.events)
    spark = build_session(Settings(data_dir=work / "spark"), "bench-aggregate", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    rates: dict[str, list[float]] = {"sqlite": [], "postgresql": [], "no SQL commit": []}
    batch_seconds: dict[str, list[float]] = {name: [] for name in rates}
    for r in range(args.repeat):
        for name in rates:
            slug = name.replace(" ", "-")
            checkpoint = work / f"cp-{slug}-{r}"
            if name == "postgresql":
                url = postgres_url(f"bench_aggregate_{r}")
            else:
                url = f"sqlite://{work / f'agg-{slug}-{r}.db'}"
            with open_db(url) as db:
                target: Any = NoCommit(db) if name == "no SQL commit" else db
                rate, seconds = job_rate(spark, log_url, target, checkpoint, args.per_batch)
            rates[name].append(rate)
            batch_seconds[name].append(seconds)
            print(f"repeat {r} {name}: {rate:,.0f} events/s", file=sys.stderr, flush=True)
    spark.stop()
    base = statistics.median(rates["no SQL commit"])
    lines = [
        "| backend | runs (events/s) | median | / no-commit baseline | s per micro-batch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, found in rates.items():
        median = statistics.median(found)
        runs = ", ".join(f"{x:,.0f}" for x in found)
        seconds = statistics.median(batch_seconds[name])
        lines.append(f"| {name} | {runs} | {median:,.0f} | {median / base:.2f} | {seconds:.2f} |")
    return lines


def cpu_seconds(collector: int, jobs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """CPU seconds so far of each part's process tree (its JVM and Python workers included),
    and of this process alone."""
    import psutil

    def tree(pid: int) -> float:
        total = 0.0
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = process.cpu_times()
                    total += times.user + times.system + times.children_user
                    total += times.children_system  # its exited children, once reaped
        except psutil.Error:
            pass
        return total

    parts = {"collector": collector, "dedupe job": jobs[0].pid, "aggregate job": jobs[1].pid}
    found = {name: tree(pid) for name, pid in parts.items()}
    own = psutil.Process().cpu_times()  # this process alone: the clients and the poller
    return {**found, "clients and poller (this script)": own.user + own.system}


def bench_e2e(args: argparse.Namespace, work: Path) -> list[str]:
    data = work / "e2e"
    settings = Settings(data_dir=data)
    exactly = [sys.executable, "-m", "exactly", "--data-dir", str(data)]
    with open_log(settings.log_url) as log:
        log.create_topic("raw", PARTITIONS)
        log.create_topic("events", PARTITIONS)
    collector = Collector(settings, PARTITIONS)
    jobs = [
        subprocess.Popen(
            [*exactly, command, "--trigger-seconds", "1"],
            stdout=subprocess.DEVNULL,
            stderr=(work / f"{command}.err").open("w"),
            start_new_session=True,
        )
        for command in ("dedupe", "aggregate")
    ]
    sent: list[tuple[float, int]] = []
    lock = threading.Lock()

    def on_sent(started: float, n: int) -> None:
        with lock:
            sent.append((started, n))

    visible: list[tuple[float, int]] = []
    done = threading.Event()

    def poll() -> None:
        db_path = data / "aggregates.db"
        import sqlite3

        while not done.is_set():
            try:
                with sqlite3.connect(db_path, timeout=1) as connection:
                    total = connection.execute('SELECT SUM("count") FROM event_counts').fetchone()[
                        0
                    ]
                visible.append((time.time(), int(total or 0)))
            except sqlite3.Error:
                pass
            time.sleep(0.1)

    try:
        while not (data / "aggregates.db").exists():  # both jobs up: the table exists
            time.sleep(0.5)
        time.sleep(5)
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        total = int(args.e2e_rate * args.e2e_seconds)
        before: list[tuple[float, dict[str, float]]] = []  # taken once the events are made

        def on_start() -> None:
            before.append((time.monotonic(), cpu_seconds(collector.proc.pid, jobs)))

        traffic = send(
            collector.port,
            total,
            resend_rate=0.0,
            rate=args.e2e_rate,
            on_sent=on_sent,
            on_start=on_start,
            seed=7,
        )
        cpu_before = before[0]
        cpu_after = (time.monotonic(), cpu_seconds(collector.proc.pid, jobs))
        deadline = time.time() + 120
        while (not visible or visible[-1][1] < total) and time.time() < deadline:
            time.sleep(0.2)
        done.set()
        poller.join()
        if not visible or visible[-1][1] < total:
            for command, process in zip(("dedupe", "aggregate"), jobs, strict=True):
                state = "running" if process.poll() is None else f"exited {process.returncode}"
                tail = (work / f"{command}.err").read_text()[-1500:]
                print(f"{command} ({state}), stderr ends:\n{tail}", file=sys.stderr)
    finally:
        collector.stop()
        for process in jobs:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()
    sent.sort()
    sent_cumulative: list[tuple[float, int]] = []
    count = 0
    for started, n in sent:
        count += n
        sent_cumulative.append((started, count))
    counts = [c for _, c in visible]
    latencies = []
    windows: dict[int, list[float]] = {}  # latencies by 10 s of sending
    for started, upto in sent_cumulative:
        at = bisect.bisect_left(counts, upto)
        if at < len(visible):
            latencies.append(visible[at][0] - started)
            windows.setdefault(int((started - sent[0][0]) // 10), []).append(latencies[-1])
    reached = visible[-1][1] if visible else 0
    last = visible[bisect.bisect_left(counts, reached)][0] if visible else 0.0
    rate = reached / (last - sent[0][0]) if sent else 0.0
    latencies.sort()
    if not latencies:
        errors = {c: (work / f"{c}.err").read_text()[-500:] for c in ("dedupe", "aggregate")}
        raise SystemExit(f"nothing became visible ({reached} events): {errors}")

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    offered = traffic.events / traffic.seconds
    return [
        "| measure | value |",
        "| --- | --- |",
        f"| events sent (offered rate) | {traffic.events:,} ({offered:,.0f} events/s) |",
        f"| events visible in SQL | {reached:,} |",
        f"| sustained end-to-end rate | {rate:,.0f} events/s |",
        f"| latency p50 (send -> visible in SQL) | {pct(0.5):.1f} s |",
        f"| latency p99 | {pct(0.99):.1f} s |",
        f"| latency max | {latencies[-1]:.1f} s |",
        *(
            f"| CPU while sending: {name} | {(cpu_after[1][name] - cpu_before[1][name]) / wall:.2f}"
            " cores |"
            for wall in [cpu_after[0] - cpu_before[0]]
            for name in cpu_after[1]
        ),
        "",
        "| sent during | latency p50 | p99 |",
        "| --- | ---: | ---: |",
        *(
            f"| {10 * w}-{10 * w + 10} s | {statistics.median(found):.1f} s | "
            f"{sorted(found)[min(len(found) - 1, int(0.99 * len(found)))]:.1f} s |"
            for w, found in sorted(windows.items())
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--per-batch", type=int, default=150_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--e2e-rate", type=float, default=20_000)
    parser.add_argument("--e2e-seconds", type=float, default=60)
    parser.add_argument("--skip-job", action="store_true")
    parser.add_argument("--skip-e2e", action="store_true")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    work = Path(tempfile.mkdtemp(prefix="bench-aggregate-"))
    try:
        if not args.skip_job:
            print("\n".join(bench_job(args, work)))
        if not args.skip_e2e:
            print("\n".join(bench_e2e(args, work)))
        print(f"load after: {os.getloadavg()}")
    finally:
        if os.environ.get("BENCH_KEEP"):
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
