"""End to end on ``exactly up`` beside the same pipeline as separate processes, same run.

    .venv/bin/python bench/e2e.py [--rate 20000] [--seconds 120] [--warm-up 30]
                                  [--modes up,separate] [--batch N] [--batched N] [--lake]
                                  [--clients 4] [--sources 2] [--in-flight 64]

Per mode, on a fresh data dir with the embedded defaults (sqlite log of 4 partitions, rocksdb
store, sqlite aggregates and JobDB) and one destination (every event) on a fast local receiver
(a raw asyncio protocol on uvloop in a process of its own, counting the events it answered 200;
its CPU while the clients sent is printed, since it shares the two cores with ``up``):

* ``up``: ``exactly up --no-live`` (collector, one Spark application with the dedupe, aggregate
  and route queries, the director);
* ``separate``: ``exactly collect``, ``dedupe``, ``aggregate``, ``route`` and ``deliver``, each its
  own process (three JVMs), as before ``up`` existed: the baseline.

Clients offer ``--rate`` events/s through ``/v1/batch`` for ``--seconds`` (``exactly.demo.send``,
``--clients`` of them, four by default, batches of 500, each waiting for its answer before its next
batch), from the demo's two sources in turn (``--sources N``: N, the extra ones ``extra-K``; a
bucket, which a director sends, is a source and a destination). The events are made before the clock
starts: the offered rate, the warm-up and the CPU figures count the sending alone. The aggregate
table and the receiver's count are polled every 0.1 s. Latency of the k-th event = when the table's
total (or the receiver's count) first reached k minus when the batch holding the k-th event was sent
(FIFO by count: an aggregate does not show each event's own moment); p50 and p99 are over the events
sent after ``--warm-up`` seconds. Backlog: the raw topic's end minus the dedupe query's position, at
the middle and at the end of the sending (growing = not sustained). ``--lake``: the Delta lake as
well (``[lake] url`` set, so ``up`` runs the lake query; ``separate`` runs ``exactly lake``), its
rows (the add actions' record counts: metadata only) polled with the rest, and accept->queryable
measured the same way; with the segment layout (``--layout``, the default) also accept->queryable in
``order_completed``, the table of the "Order Completed" events, against when each batch's events of
that name were sent. ``--batched N``: a second destination (every event too, on its own path of the
same receiver) sending batches of up to N events (``json-array``, ``max_wait`` 200 ms), its
accept->delivered measured apart from the first one's. ``--directors N``: ``up`` starts N directors
over 8 partitions. With ``up``, accept->routed too: when the route query had added the jobs of an
event to the JobDB (the datasets' row counts, read 10 times a second; no job is read), which splits
accept->delivered into the Spark side's part and the director's. Last, the CPU each process used
while the clients sent, and the same per event sent for each part (the JVM, Spark's Python workers,
the collector, the pipeline's driver, the directors): what the offered rate moves least, for
comparing code on a busy machine; and each query's micro-batches that started while the clients
sent, from its checkpoint (``bench/micro_batches.py``): their durations, the waits between them and
their records, which is where the latencies go."""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import multiprocessing
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson

import micro_batches  # type: ignore[import-not-found]
from delivery import Answer200  # type: ignore[import-not-found]
from exactly.config import load_settings
from exactly.delivery.jobdb.sqlite import FILE as JOBDB_FILE
from exactly.demo import SOURCES, collector_answers, free_port, send
from exactly.log import open_log
from exactly.up import watch

PARTITIONS = 4
ORDER_COMPLETED = "Order Completed"  # one of the demo's event names
ORDERS = "order_completed"  # its table in the segment layout


class _Counting(Answer200):
    """The receiver: ``bench/delivery.py``'s raw protocol, counting each request's events (a
    json-array body's length, else one) by path. No framework: the destination's cost is not
    ``up``'s, and it shares the two cores with it. Counts are added to the shared ones every
    20 ms."""

    counts: ClassVar[list[int]] = [0, 0]  # every path but /batched, /batched: since the flush

    def received(self, head: bytes, buffer: bytes, body_at: int, length: int) -> None:
        if b"transfer-encoding:" in head:
            raise SystemExit("the e2e receiver reads Content-Length bodies only")
        body = buffer[body_at : body_at + length]
        events = len(orjson.loads(body)) if body[:1] == b"[" else 1
        self.counts[head.startswith(b"post /batched")] += events


def _serve(port: int, count: Synchronized, batched: Synchronized) -> None:  # type: ignore[type-arg]
    import uvloop

    async def flush() -> None:
        while True:
            await asyncio.sleep(0.02)
            for index, counter in enumerate((count, batched)):
                added, _Counting.counts[index] = _Counting.counts[index], 0
                if added:
                    with counter.get_lock():
                        counter.value += added

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(_Counting, "127.0.0.1", port, backlog=1024)
        await flush()

    uvloop.run(serve())


@contextlib.contextmanager
def receiver() -> Iterator[tuple[str, Synchronized, Synchronized, int]]:  # type: ignore[type-arg]
    """The receiver's URL, its counts of events (at any path but ``/batched``, and at it) and its
    process id."""
    context = multiprocessing.get_context("spawn")
    count, batched = context.Value("q", 0), context.Value("q", 0)
    port = free_port()
    process = context.Process(target=_serve, args=(port, count, batched), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{port}", count, batched, process.pid or 0
    finally:
        process.kill()
        process.join()


def sources_of(count: int) -> dict[str, str]:
    """The demo's two sources, then ``extra-N`` ones up to ``count`` (name -> write key)."""
    extra = {f"extra-{n}": f"bench-extra-{n}-write-key" for n in range(max(0, count - 2))}
    return {**SOURCES, **extra}


def write_config(
    directory: Path,
    receiver_url: str,
    batch: int = 1,
    lake: bool = False,
    batched: int = 0,
    directors: int = 1,
    layout: str = "segment",
    source_count: int = 2,
    in_flight: int = 64,
    lanes: int = 1,
) -> tuple[Path, int]:
    batching = '\n[destinations.batch]\nmax_events = {}\nmax_wait = "200ms"\n'
    port = free_port()
    sources = "\n".join(f'{name} = "{key}"' for name, key in sources_of(source_count).items())
    config = directory / "exactly.toml"
    config.write_text(
        f"""data_dir = "{directory / "data"}"

[collector]
port = {port}
partitions = {PARTITIONS}

[collector.sources]
{sources}

[[destinations]]
name = "all"
url = "{receiver_url}/all"
max_in_flight = {8 if batch > 1 else in_flight}
"""
        + (f"lanes = {lanes}\n" if batch == 1 and lanes > 1 else "")
        + (batching.format(batch) if batch > 1 else "")
        + (
            f'\n[[destinations]]\nname = "batched"\nurl = "{receiver_url}/batched"\n'
            f"max_in_flight = 8\n{batching.format(batched)}"
            if batched > 1
            else ""
        )
        + (f"\n[delivery]\npartitions = 8\ndirectors = {directors}\n" if directors > 1 else "")
        + (
            f'\n[lake]\nurl = "delta://{directory / "data" / "lake" / "events"}"\n'
            f'layout = "{layout}"\n'
            if lake
            else ""
        )
    )
    return config, port


def start_parts(
    mode: str, config: Path, work: Path, lake: bool = False
) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "EXACTLY_CONFIG": str(config)}
    exactly = [sys.executable, "-m", "exactly"]
    if mode == "up":
        commands = [["up", "--no-live"]]
    else:
        commands = [
            ["collect"],
            ["dedupe", "--trigger-seconds", "1"],
            ["aggregate", "--trigger-seconds", "1"],
            ["route", "--trigger-seconds", "1"],
            ["deliver"],
            *([["lake", "--trigger-seconds", "1"]] if lake else []),
        ]
    return [
        subprocess.Popen(
            [*exactly, *command],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=(work / f"{mode}-{command[0]}.err").open("wb"),
            start_new_session=True,
        )
        for command in commands
    ]


def _cpu(parts: list[subprocess.Popen[bytes]]) -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) so far of each process of the pipeline, by pid and a name
    (its command's words after ``-m exactly``, or ``java`` and its main class)."""
    import psutil

    found: dict[tuple[int, str], float] = {}
    for part in parts:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(part.pid)
            for process in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    words = process.cmdline()
                    if "exactly" in words:
                        name = " ".join(words[words.index("exactly") + 1 :][:2])
                    else:
                        name = " ".join(w for w in words if not w.startswith("-"))[-60:]
                    times = process.cpu_times()
                    found[(process.pid, name)] = times.user + times.system
    return found


def _cpu_of(pid: int) -> float:
    """One process's CPU seconds so far."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def _cpu_report(
    before: dict[tuple[int, str], float], after: dict[tuple[int, str], float], seconds: float
) -> list[str]:
    spent = {key: value - before.get(key, 0.0) for key, value in after.items()}
    return [
        f"{value:7.1f} s CPU ({value / seconds:.2f} cores) pid {pid} {name}"
        for (pid, name), value in sorted(spent.items(), key=lambda item: -item[1])
    ]


PARTS = (  # a process's part, by words of its name (the first that matches)
    ("the JVM", ("pyspark-shell",)),
    ("Spark's Python workers", ("pyspark.worker", "pyspark.daemon", "pyspark.sql")),
    ("the collector", ("collect", "appender", "collector")),
    ("the pipeline's driver", ("pipeline",)),
    ("the directors", ("deliver",)),
)


def _cpu_per_event(
    before: dict[tuple[int, str], float], after: dict[tuple[int, str], float], events: int
) -> str:
    """Microseconds of CPU per event for each part of the pipeline (:data:`PARTS`), then all of
    it: the figure the offered rate moves least, for comparing code on a busy machine."""
    parts: dict[str, float] = dict.fromkeys([name for name, _ in PARTS] + ["the rest"], 0.0)
    for (pid, name), value in after.items():
        part = next((p for p, words in PARTS if any(w in name for w in words)), "the rest")
        parts[part] += value - before.get((pid, name), 0.0)
    micros = {part: seconds * 1e6 / max(events, 1) for part, seconds in parts.items()}
    shown = ", ".join(f"{part} {value:.0f} µs" for part, value in micros.items())
    return f"{shown}; all {sum(micros.values()):.0f} µs"


def counted(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=1)) as db:
            row = db.execute('SELECT COALESCE(SUM("count"), 0) FROM event_counts').fetchone()
        return int(row[0])
    except sqlite3.Error:
        return 0


def routed(path: Path, per_event: int) -> int:
    """Events the route query has added jobs for: the JobDB's job ids so far (its datasets'
    first ids and row counts, a few rows) over the jobs each event makes."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            row = db.execute(
                "SELECT COALESCE(MAX(first_id + n_rows - 1), 0) FROM jobdb_datasets"
            ).fetchone()
        return int(row[0]) // per_event
    except sqlite3.Error:
        return 0


_TABLES: dict[Path, Any] = {}  # the Delta table polled, opened once and brought up to date


def landed(path: Path) -> int:
    """Rows in the Delta table's current version, from its add actions (no data read). The
    table is opened once and then reads only the commits since (``update_incremental``): a
    fresh open every 0.1 s would replay its log each time, beside the pipeline measured."""
    from deltalake import DeltaTable

    try:
        table = _TABLES.get(path)
        if table is None:
            table = _TABLES[path] = DeltaTable(str(path))
        else:
            table.update_incremental()
        actions = table.get_add_actions(flatten=True)
        return int(sum(n or 0 for n in actions.column("num_records").to_pylist()))
    except Exception:  # noqa: BLE001 - not created yet, or a commit being written
        return 0


def latencies(
    sent: list[tuple[float, int]], seen: list[tuple[float, int]], after: float
) -> list[float]:
    """Per accepted batch sent after ``after``: when ``seen`` first reached its last event."""
    counts = [c for _, c in seen]
    found = []
    total = 0
    for started, n in sorted(sent):
        total += n
        at = bisect.bisect_left(counts, total)
        if started >= after and at < len(seen):
            found.append(seen[at][0] - started)
    return sorted(found)


def drained(counts: list[tuple[float, int]], total: int, ended: float) -> str:
    """When a destination had all ``total`` events, from the sending's end (its backlog)."""
    done = next((at for at, count in counts if count >= total), None)
    if done is None:
        return f"not delivered: {counts[-1][1]:,} of {total:,}"
    return f"{done - ended:.1f} s after the sending's end"


def pct(values: list[float], p: float) -> str:
    if not values:
        return "-"
    return f"{values[min(len(values) - 1, int(p * len(values)))]:.1f} s"


def run_mode(mode: str, args: argparse.Namespace, work: Path) -> list[str]:
    home = work / mode
    home.mkdir()
    with receiver() as (url, delivered, delivered_batched, receiver_pid):
        config, port = write_config(
            home,
            url,
            args.batch,
            args.lake,
            args.batched,
            args.directors,
            args.layout,
            args.sources,
            args.in_flight,
            args.lanes,
        )
        settings = load_settings(config)
        with open_log(settings.log_url) as log:
            log.create_topic("raw", PARTITIONS, exist_ok=True)
            log.create_topic("events", PARTITIONS, exist_ok=True)
        parts = start_parts(mode, config, home, args.lake)
        lake_path = settings.data_dir / "lake" / "events"
        segment = args.lake and args.layout == "segment"
        table = settings.data_dir / "aggregates.db"
        jobdb = Path(settings.jobdb_url.partition("://")[2]) / JOBDB_FILE  # sqlite://DIR
        per_event = 2 if args.batched > 1 else 1  # every destination takes every event
        stages = watch.stages(settings)
        # the poll reads the dedupe lag only: without destinations, watch.take leaves the
        # JobDB's summary (a scan of every job) alone, which would load the JobDB 10 times a
        # second beside the director it measures
        quiet = settings.model_copy(update={"destinations": []})
        try:
            began = time.monotonic()
            while not (collector_answers(port) and table.exists()):
                if time.monotonic() - began > 180:
                    raise SystemExit(f"{mode}: the pipeline did not start; see {home}")
                time.sleep(0.5)
            time.sleep(5)  # the queries' first (empty) micro-batches
            visible: list[tuple[float, int]] = []
            arrived: list[tuple[float, int]] = []
            arrived_batched: list[tuple[float, int]] = []
            queryable: list[tuple[float, int]] = []
            orders: list[tuple[float, int]] = []  # rows of order_completed (segment layout)
            jobs: list[tuple[float, int]] = []
            backlog: list[tuple[float, int]] = []
            done = threading.Event()

            def poll() -> None:
                with open_log(settings.log_url) as log:
                    while not done.is_set():
                        now = time.time()
                        visible.append((now, counted(table)))
                        arrived.append((now, int(delivered.value)))
                        arrived_batched.append((now, int(delivered_batched.value)))
                        jobs.append((now, routed(jobdb, per_event)))
                        if args.lake:
                            queryable.append((now, landed(lake_path)))
                        if segment:
                            orders.append((now, landed(lake_path.parent / ORDERS)))
                        snapshot = watch.take(quiet, log, stages[:1])
                        lag = snapshot.lag(stages[0])
                        backlog.append((now, -1 if lag is None else lag))
                        time.sleep(0.1)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            sent: list[tuple[float, int]] = []
            lock = threading.Lock()

            sent_orders: list[tuple[float, int]] = []

            def on_accepted(started: float, events: list[dict[str, Any]]) -> None:
                found = sum(1 for event in events if event.get("event") == ORDER_COMPLETED)
                with lock:
                    sent.append((started, len(events)))
                    sent_orders.append((started, found))

            total = int(args.rate * args.seconds)
            start: dict[str, Any] = {}

            def on_start() -> None:  # every event made: the clock starts here
                start.update(cpu=_cpu(parts), first=time.time(), receiver=_cpu_of(receiver_pid))

            traffic = send(
                port,
                total,
                clients=args.clients,
                resend_rate=0.0,
                rate=args.rate,
                on_accepted=on_accepted,
                on_start=on_start,
                sources=sources_of(args.sources),
                seed=7,
            )
            ended = time.time()
            cpu, first = start["cpu"], start["first"]
            receiver_cpu = _cpu_of(receiver_pid) - start["receiver"]
            spent = _cpu(parts)
            cpu_lines = _cpu_report(cpu, spent, ended - first)
            cpu_per_event = _cpu_per_event(cpu, spent, traffic.events)
            deadline = time.time() + 300
            while (
                visible[-1][1] < total
                or arrived[-1][1] < total
                or (args.batched > 1 and arrived_batched[-1][1] < total)
                or (args.lake and queryable[-1][1] < total)
                or (segment and orders[-1][1] < sum(n for _, n in sent_orders))
            ) and time.time() < deadline:
                time.sleep(0.2)
            drain_seconds = time.time() - ended
            drain_lines = _cpu_report(spent, _cpu(parts), drain_seconds)[:6]
            done.set()
            poller.join()
        finally:
            for part in parts:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(part.pid, signal.SIGTERM)
            for part in parts:
                try:
                    part.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(part.pid, signal.SIGKILL)
                    part.wait()
    after = first + args.warm_up
    to_counted = latencies(sent, visible, after)
    to_delivered = latencies(sent, arrived, after)
    to_routed = latencies(sent, jobs, after)
    to_lake = latencies(sent, queryable, after) if args.lake else []
    if segment:
        to_orders = latencies(sent_orders, orders, after)
        print(
            f"{mode}: accept->queryable in {ORDERS} p50 / p99 "
            f"{pct(to_orders, 0.5)} / {pct(to_orders, 0.99)} "
            f"({orders[-1][1]:,} of {sum(n for _, n in sent_orders):,} rows)"
        )
    to_batched = latencies(sent, arrived_batched, after) if args.batched > 1 else []
    middle = min(backlog, key=lambda entry: abs(entry[0] - (first + ended) / 2))[1]
    last = min(backlog, key=lambda entry: abs(entry[0] - ended))[1]
    reached = visible[-1][1]
    finished = next((t for t, c in visible if c >= reached), ended)
    print(f"{mode}: accept->routed p50 / p99 {pct(to_routed, 0.5)} / {pct(to_routed, 0.99)}")
    for name, counts in (("delivered", arrived), ("delivered in batches", arrived_batched)):
        if counts[-1][1]:
            print(f"{mode}: {name}: the last event {drained(counts, total, ended)}")
    print(f"{mode}: CPU while sending ({ended - first:.0f} s), per process:")
    print("\n".join(f"  {line}" for line in cpu_lines), flush=True)
    print(f"{mode}: CPU per event sent, while sending: {cpu_per_event}", flush=True)
    print(f"{mode}: CPU after the sending, until all was there ({drain_seconds:.0f} s), the most:")
    print("\n".join(f"  {line}" for line in drain_lines), flush=True)
    print(
        f"{mode}: the receiver (not part of {mode}) while sending: {receiver_cpu:.1f} s CPU "
        f"({receiver_cpu / (ended - first):.2f} cores)"
    )
    print(f"{mode}: micro-batches that started while sending (bench/micro_batches.py):")
    print("\n".join(micro_batches.table(settings.data_dir, first, ended)), flush=True)
    return [
        f"| {mode} | {traffic.events / traffic.seconds:,.0f} | "
        f"{reached / max(finished - first, 1e-9):,.0f} | {middle:,} -> {last:,} | "
        f"{pct(to_counted, 0.5)} / {pct(to_counted, 0.99)} | "
        f"{pct(to_delivered, 0.5)} / {pct(to_delivered, 0.99)} | "
        + (f"{pct(to_batched, 0.5)} / {pct(to_batched, 0.99)} | " if args.batched > 1 else "")
        + (f"{pct(to_lake, 0.5)} / {pct(to_lake, 0.99)} | " if args.lake else "")
        + f"{reached:,} / {arrived[-1][1]:,}"
        + (f" / {arrived_batched[-1][1]:,}" if args.batched > 1 else "")
        + f" of {total:,} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20_000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--warm-up", type=float, default=30)
    parser.add_argument("--modes", default="up,separate")
    parser.add_argument("--batch", type=int, default=1, help="the destination's max_events")
    parser.add_argument("--lake", action="store_true", help="land the events in a Delta lake")
    parser.add_argument("--layout", default="segment", choices=("segment", "events"))
    parser.add_argument(
        "--directors", type=int, default=1, help="[delivery] directors (8 partitions when > 1)"
    )
    parser.add_argument(
        "--sources",
        type=int,
        default=2,
        help="sources sending, the batches in turn (a bucket is a source and a destination)",
    )
    parser.add_argument(
        "--in-flight", type=int, default=64, help="the single-event destination's max_in_flight"
    )
    parser.add_argument(
        "--lanes", type=int, default=1, help="the single-event destination's lanes (by user)"
    )
    parser.add_argument(
        "--clients", type=int, default=4, help="clients sending, each a batch at a time"
    )
    parser.add_argument(
        "--batched", type=int, default=0, help="a second destination's max_events (0: none)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="exactly-e2e-"))
    batched = args.batched > 1
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"offered {args.rate:,.0f} events/s for {args.seconds:.0f} s; work dir {work}")
    lines = [
        "| mode | offered events/s | sustained events/s | raw backlog mid -> end | "
        f"accept->counted p50 / p99 (after {args.warm_up:.0f} s) | accept->delivered p50 / p99 "
        + (f"| accept->delivered in batches of {args.batched} p50 / p99 " if batched else "")
        + ("| accept->queryable in the lake p50 / p99 " if args.lake else "")
        + (
            "| counted / delivered / delivered in batches |"
            if batched
            else "| counted / delivered |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        + (" ---: |" if batched else "")
        + (" ---: |" if args.lake else ""),
    ]
    try:
        for mode in args.modes.split(","):
            lines += run_mode(mode.strip(), args, work)
            print(lines[-1], flush=True)
    finally:
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
