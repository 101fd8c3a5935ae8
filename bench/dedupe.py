"""Dedupe throughput: the rocksdb store alone, and the job with each store, in one run.

    .venv/bin/python bench/dedupe.py [--events 5000000] [--job-events 2000000] [--batch 10000]
    .venv/bin/python bench/dedupe.py --task 200000
    .venv/bin/python bench/dedupe.py --suppress 200000
    .venv/bin/python bench/dedupe.py --worker 200000 [--repeat 5]
    .venv/bin/python bench/dedupe.py --write 300000 [--repeat 5]
    .venv/bin/python bench/dedupe.py --open 8

(a) **Store layer**: claims/s on one core for the rocksdb store (one partition, batches of
``--batch`` claims, UUID messageIds, 1% duplicates of recent ids, received 100,000 a second, so
5 M span 50 s; the store's ``--window``, default the job's 24 h: one generation, none aged out;
``--window 5s`` keeps 8 to 10 generations and ages out), steady state: the first 10% of the
claims warm up and are not timed. Then the live generations, and bytes on disk per kept key, as
written and after a full compaction (forced, so that every file is rewritten as RocksDB's own
compactions eventually do: bottommost compression, sequence numbers zeroed).

(b) **Job**: events/s through the dedupe job (`exactly dedupe`'s query, Trigger.AvailableNow,
local[2], 8 raw partitions on the embedded sqlite log, events of ~300 B as the collector stores
them (compact JSON, ``sourceId`` set last; 4 sources, a duplicate from its original's source)
with 1% duplicates), for
rocksdb and spark-state in the same run on the same raw topic. Each job runs in a fresh process
(its own JVM, data dir and output topic), in the order rocksdb, spark-state, spark-state,
rocksdb, so that warm-up and drifting machine load treat both alike; the table has each run and
the ratio of the medians. Steady state = the batches after the first (which includes the query's
and JIT's warm-up). ``--scope`` is the jobs' dedupe scope (default: source). Prints markdown
tables.

(c) **Task** (``--task N``, instead of (a) and (b)): the dedupe job's task alone
(``dedupe_partition`` over Arrow batches of 10,000 records, rocksdb store, no Spark) on one core,
in records per CPU second (CPU time, so that other load on the machine counts less), for each
dedupe scope over N values of ~300 B in the collector's layout (``sourceId`` last, read from the
tail) and in another (``sourceId`` first, with spaces: parsed). Runs interleaved, median of 3.

(c') **Suppression** (``--suppress N``, instead of the others): the task of (c) (collector's
layout, with a ``userId`` and an ``anonymousId`` in each value; scope ``source``) in records per
CPU second three ways, interleaved, median of 3: with no forget key (``exactly dedupe`` run
without a data dir), with the key and no regulation (nothing is parsed), and with one regulation
of a person none of the records is (each passing record's JSON parsed and its two ids hashed:
what suppression costs every record once anybody is forgotten).

(d) **Worker** (``--worker N``, instead of the others): the dedupe job's sink worker, whose
Python work bounds the job: per record, in CPU µs of the whole process (every thread), the task
as in (c) (collector's layout, scope ``source``), then the sink's marked appends into the sqlite
log both ways: as record columns (``_in_columns``, ``PartitionOutput.add_columns``: the sink's
way for batches with a partition column) and as rows (``_grouped``, ``PartitionOutput.add``:
its way for the others), each into its own topic; a fresh log and store per run, median of
``--repeat`` runs.

(e) **RocksDB's write** (``--write N``, instead of the others): µs a key of ``Rdict.write`` alone
for batches of 10,000 new random ids with the store's options, synced (as the store writes),
not synced, and without the WAL: what the store's claims cannot go below.

(f) **Open and close** (``--open N``, instead of the others): ms to open a rocksdb partition and
to close it, N times in turn, each after one call of 3 x ``--batch`` new claims (as a task of
the job opens and closes each raw partition it dedupes; the close flushes the memtable).
"""

from __future__ import annotations

import argparse
import contextlib
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
from rocksdict import BottommostLevelCompaction, CompactOptions, Rdict, WriteBatch, WriteOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactly.dedupe.base import Claim
from exactly.dedupe.rocksdb import RocksDBStore, _options
from exactly.dedupe.window import Bounds
from exactly.events import partition_for
from exactly.events.ids import pack_id, pack_owner
from exactly.log import Record, open_log
from exactly.units import parse_duration

DUPLICATES = 0.01
PARTITIONS = 8
SOURCES = ("web", "ios", "android", "server")


def message_ids(count: int, rng: random.Random) -> list[str]:
    """``count`` messageIds, 1% of them repeating one of the last 100,000."""
    out: list[str] = []
    for _ in range(count):
        if out and rng.random() < DUPLICATES:
            out.append(out[-rng.randint(1, min(len(out), 100_000))])
        else:
            out.append(str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    return out


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def store_layer(events: int, batch: int, where: Path, window: str) -> dict[str, Any]:
    rng = random.Random(1)
    ids = [pack_id(m) for m in message_ids(events, rng)]
    store = RocksDBStore(where, Bounds(window=parse_duration(window)))
    warm = events // 10
    timed = 0.0
    dups = 0
    with store.open(0) as part:
        for start in range(0, events, batch):
            claims = [
                Claim(ids[o], pack_owner(0, o), 1_700_000_000_000 + o // 100)
                for o in range(start, min(events, start + batch))
            ]
            began = time.perf_counter()
            verdicts = part.claim(claims)
            if start >= warm:
                timed += time.perf_counter() - began
            dups += sum(1 for v in verdicts if not v.passes)
        keys = part.stats().keys
        live = getattr(part, "generations", None)  # None: a layout before generations
        generations = "-" if live is None else len(live())
    written = directory_bytes(store.path(0))
    full = CompactOptions()  # rewrite even a lone file (no trivial move), as compaction would
    full.set_bottommost_level_compaction(BottommostLevelCompaction.force())
    with store.open(0) as part:
        db: Any = part.db  # type: ignore[attr-defined]
        for name in Rdict.list_cf(str(store.path(0))):  # every layout's column families
            view = db if name == "default" else db.get_column_family(name)
            view.flush()
            view.compact_range(None, None, full)
            if view is not db:
                view.close()
    compacted = directory_bytes(store.path(0))
    return {
        "claims": events,
        "duplicates": dups,
        "keys": keys,
        "generations": generations,
        "claims_per_s": (events - warm) / timed,
        "bytes_per_key_written": written / keys,
        "bytes_per_key_compacted": compacted / keys,
    }


def fill_raw(log_url: str, events: int) -> None:
    rng = random.Random(2)
    pad = "x" * 200
    with open_log(log_url) as log:
        log.create_topic("raw", PARTITIONS, exist_ok=True)
        pending: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        for n, message_id in enumerate(message_ids(events, rng)):
            value = orjson.dumps(  # as the collector stores it: compact, sourceId set last
                {
                    "messageId": message_id,
                    "type": "track",
                    "event": "Bench",
                    "n": n,
                    "p": pad,
                    "sourceId": SOURCES[int(message_id[0], 16) % len(SOURCES)],
                }
            )
            pending[partition_for(message_id, PARTITIONS)].append(
                Record(value, key=message_id.encode())
            )
            if n % 50_000 == 49_999:
                log.append_many("raw", pending)
                pending = {p: [] for p in range(PARTITIONS)}
        log.append_many("raw", pending)


def task_batches(count: int, layout: str, *, people: bool = False) -> list[Any]:
    """Arrow batches of 10,000 records of raw partition 0, as the source gives the task.

    ``layout``: ``collector`` (compact JSON, ``sourceId`` last: read from the tail) or ``parsed``
    (``sourceId`` first, with spaces: parsed). ``people``: each event has a ``userId`` (1,000
    users) and an ``anonymousId``."""
    import pyarrow as pa  # type: ignore[import-untyped]

    from exactly.spark.datasource.source import ARROW_SCHEMA

    ids = [m.encode() for m in message_ids(count, random.Random(3))]
    headers = ARROW_SCHEMA.field("headers").type

    def value(message_id: bytes, n: int) -> bytes:
        event = {"messageId": message_id.decode(), "type": "track", "n": n, "p": "x" * 200}
        if people:
            event |= {"userId": f"user-{n % 1000}", "anonymousId": f"anon-{n % 7919:08d}"}
        if layout == "collector":
            return orjson.dumps({**event, "sourceId": "web"})
        return json.dumps({"sourceId": "web", **event}).encode()

    out = []
    for start in range(0, count, 10_000):
        chunk = ids[start : start + 10_000]
        n = len(chunk)
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([0] * n, pa.int32()),
                    pa.array(range(start, start + n), pa.int64()),
                    pa.array(chunk, pa.binary()),
                    pa.array([value(m, start + i) for i, m in enumerate(chunk)]),
                    pa.array(
                        [1_700_000_000_000_000 + 1000 * (start + i) for i in range(n)],
                        pa.timestamp("us", tz="UTC"),
                    ),
                    pa.array([[]] * n, headers),
                ],
                schema=ARROW_SCHEMA,
            )
        )
    return out


def _task_topics(url: str) -> None:
    with open_log(url) as log:
        for topic in ("raw", "events", "raw.rejected"):
            log.create_topic(topic, 1)


def task_rates(count: int, repeat: int = 3) -> dict[tuple[str, str], list[float]]:
    """(c): records per CPU second of the dedupe task, per (layout, scope)."""
    from exactly.dedupe.task import TaskPlan, dedupe_partition

    root = Path(tempfile.mkdtemp(prefix="exactly-bench-task-"))
    url = f"sqlite://{root / 'log'}"
    _task_topics(url)
    inputs = {layout: task_batches(count, layout) for layout in ("collector", "parsed")}
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for run in range(repeat):
            for layout, found in inputs.items():
                for scope in ("workspace", "source"):
                    store = RocksDBStore(root / f"store-{run}-{layout}-{scope}")
                    plan = TaskPlan(url, "raw", "events", "raw.rejected", store, scope=scope)
                    began = time.process_time()
                    passed = sum(b.num_rows for b in dedupe_partition(plan, iter(found)))
                    rates.setdefault((layout, scope), []).append(
                        passed / (time.process_time() - began)
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rates


SUPPRESSION_WAYS = ("no forget key", "key, no regulation", "one regulation")


def suppress_rates(count: int, repeat: int = 3) -> dict[str, list[float]]:
    """(c'): records per CPU second of the dedupe task, with and without suppression."""
    from exactly.dedupe.task import TaskPlan, dedupe_partition
    from exactly.forget.regulations import USER, Regulations

    root = Path(tempfile.mkdtemp(prefix="exactly-bench-suppress-"))
    found = task_batches(count, "collector", people=True)
    key = os.urandom(32)
    rates: dict[str, list[float]] = {}
    try:
        for run in range(repeat):
            for way in SUPPRESSION_WAYS:
                url = f"sqlite://{root / f'log-{run}-{way[:3]}'}"
                _task_topics(url)
                if way == "one regulation":
                    with open_log(url) as log:
                        Regulations(log).record(key, {USER: ["nobody-here"]}, ("log",))
                store = RocksDBStore(root / f"store-{run}-{way[:3]}")
                forget_key = None if way == "no forget key" else key
                plan = TaskPlan(url, "raw", "events", "raw.rejected", store, forget_key=forget_key)
                began = time.process_time()
                passed = sum(b.num_rows for b in dedupe_partition(plan, iter(found)))
                rates.setdefault(way, []).append(passed / (time.process_time() - began))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rates


def write_costs(count: int, repeat: int = 3) -> dict[str, list[float]]:
    """(e): µs a key of RocksDB's own write of claim batches, the store's options, three ways.

    ``count`` random 16-byte ids, each with a 6-byte owner offset as the store writes them, in
    write batches of 10,000 into a fresh database; only ``Rdict.write`` is timed (wall clock).
    """
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-write-"))
    ways = {"synced (as the store writes)": (True, False), "not synced": (False, False)}
    ways["without the WAL"] = (False, True)
    costs: dict[str, list[float]] = {}
    try:
        for run in range(repeat):
            for way, (name, (sync, no_wal)) in enumerate(ways.items()):
                db = Rdict(str(root / f"{run}-{way}"), _options(True))
                options = WriteOptions()
                options.sync, options.disable_wal = sync, no_wal
                ids = [os.urandom(16) for _ in range(count)]
                spent = 0.0
                for at in range(0, count, 10_000):
                    batch = WriteBatch(raw_mode=True)
                    for found in ids[at : at + 10_000]:
                        batch.put(found, b"\0\0\0\0\0\1")
                    began = time.perf_counter()
                    db.write(batch, options)
                    spent += time.perf_counter() - began
                db.close()
                costs.setdefault(name, []).append(spent / count * 1e6)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return costs


def open_costs(calls: int, claims: int) -> dict[str, list[float]]:
    """(f): ms to open and to close a rocksdb partition, as the job does once per task and raw
    partition, each time after one call of ``claims`` new claims (``close`` flushes them)."""
    from exactly.events.ids import pack_owners

    root = Path(tempfile.mkdtemp(prefix="exactly-bench-open-"))
    store, costs, offset = RocksDBStore(root), {}, 0
    try:
        for _ in range(calls):
            owners = pack_owners(0, range(offset, offset + claims))
            found = [Claim(os.urandom(16), owner, 1_700_000_000_000) for owner in owners]
            offset += claims
            began = time.perf_counter()
            part = store.open(0)
            costs.setdefault("open", []).append((time.perf_counter() - began) * 1e3)
            part.claim(found)
            began = time.perf_counter()
            part.close()
            costs.setdefault("close", []).append((time.perf_counter() - began) * 1e3)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return costs


def worker_costs(count: int, repeat: int = 3) -> dict[str, list[float]]:
    """(d): CPU µs per record of the dedupe job's sink worker, part by part (module docstring).

    Each run into a fresh log and store: the task (``dedupe_partition``), then the sink's two
    ways to append its output, each into its own topic: as record columns (``_in_columns``, then
    ``PartitionOutput.add_columns``: what the sink does) and as rows (``_grouped``, then
    ``PartitionOutput.add``: the sink's way for batches the columns cannot take), with the
    cyclic collector paused as the sink pauses it. CPU time of the whole process, every thread.
    ``worker`` is the task and the columns' parts.
    """
    from exactly.dedupe.task import TaskPlan, dedupe_partition
    from exactly.gc_pause import collection_paused
    from exactly.spark.datasource.marks import Mark
    from exactly.spark.datasource.sink import Columns, PartitionOutput, _grouped, _in_columns

    root = Path(tempfile.mkdtemp(prefix="exactly-bench-worker-"))
    found = task_batches(count, "collector")
    columns = Columns(key=True, partition=True, headers=True, timestamp=True)
    costs: dict[str, list[float]] = {}

    def spent(name: str, began: float) -> float:
        costs.setdefault(name, []).append((time.process_time() - began) / count * 1e6)
        return time.process_time()

    try:
        for run in range(repeat):
            url = f"sqlite://{root / f'log-{run}'}"
            _task_topics(url)
            plan = TaskPlan(url, "raw", "events", "raw.rejected", RocksDBStore(root / f"s{run}"))
            with open_log(url) as log, collection_paused():
                log.create_topic("events-rows", 1)
                began = time.process_time()
                staged = list(dedupe_partition(plan, iter(found)))
                began = spent("task", began)
                parts = [_in_columns(batch, columns, 1)[0][1] for batch in staged]
                began = spent("columns (`_in_columns`)", began)
                output = PartitionOutput(log, "events", 0, Mark(f"s{run}", 1, 0, 0), 0, 10_000)
                for part in parts:
                    output.add_columns(part)
                output.finish()
                output.close()
                began = spent("appends of columns (`add_columns`)", began)
                rows = [_grouped(batch, columns, 1)[0] for batch in staged]
                began = spent("rows (`_grouped`)", began)
                output = PartitionOutput(log, "events-rows", 0, Mark(f"s{run}", 1, 0, 0), 0, 10_000)
                for found_rows in rows:
                    output.add(found_rows)
                output.finish()
                output.close()
                spent("appends of rows (`add`)", began)
            worker = ("task", "columns (`_in_columns`)", "appends of columns (`add_columns`)")
            costs.setdefault("worker (task, columns, their appends)", []).append(
                sum(costs[name][-1] for name in worker)
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return costs


def job(
    log_url: str,
    data_dir: Path,
    store: str,
    events: int,
    per_trigger: int,
    output: str,
    scope: str = "source",
) -> dict[str, Any]:
    from exactly.config import Settings
    from exactly.dedupe.job import DedupePlan, prepare, run
    from exactly.dedupe.window import Bounds
    from exactly.spark.session import build_session

    spark = build_session(Settings(data_dir=data_dir), "exactly-bench-dedupe", master="local[2]")
    spark.conf.set("spark.sql.shuffle.partitions", str(PARTITIONS))
    plan = DedupePlan(
        log_url,
        store,
        data_dir,
        data_dir / f"checkpoint-{store}",
        output=output,
        bounds=Bounds(window=7 * 86_400_000),
        until_caught_up=True,
        max_records_per_trigger=per_trigger,
        read_records=10_000,
        scope=scope,
    )
    with open_log(log_url) as log:
        partitions = prepare(log, plan)
        began, cpu = time.perf_counter(), tree_cpu()
        progress = run(spark, plan, partitions)
        elapsed, cpu = time.perf_counter() - began, tree_cpu() - cpu
        passed = sum(log.end_offsets(plan.output).values())
    batches = [progress.batches[b] for b in sorted(progress.batches)]
    try:  # (a tree before ranges, on PYTHONPATH for a same-run baseline: Spark's rows)
        from exactly.dedupe.job import records_read
    except ImportError:

        def records_read(report: dict[str, Any], ranges: bool) -> int:
            return int(report.get("numInputRows", 0))

    ranges = store != "spark-state"
    steady = [b for b in batches[1:] if records_read(b, ranges)]
    steady_rows = sum(records_read(b, ranges) for b in steady)
    steady_seconds = sum(int(b["durationMs"]["triggerExecution"]) for b in steady) / 1000
    return {
        "store": store,
        "events": events,
        "passed": passed,
        "seconds": elapsed,
        "events_per_s": events / elapsed,
        "steady_per_s": steady_rows / steady_seconds if steady_seconds else float("nan"),
        "batches": len(batches),
        "cpu_us_per_event": cpu / events * 1e6,
    }


def tree_cpu() -> float:
    """CPU seconds of this process and every process under it (the JVM, its Python workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=5_000_000, help="claims for (a)")
    parser.add_argument("--job-events", type=int, default=5_000_000, help="raw events for (b)")
    parser.add_argument("--batch", type=int, default=10_000, help="claims per call in (a)")
    parser.add_argument(
        "--window", default="24h", help="the store's window in (a), e.g. 10s: 8 generations"
    )
    parser.add_argument("--per-trigger", type=int, default=1_000_000, help="records per batch (b)")
    parser.add_argument("--skip-job", action="store_true")
    parser.add_argument("--scope", default="source", help="the jobs' dedupe scope (b)")
    parser.add_argument("--task", type=int, metavar="N", help="only (c), over N records")
    parser.add_argument("--suppress", type=int, metavar="N", help="only (c'), N records")
    parser.add_argument("--write", type=int, metavar="N", help="only (e), over N ids")
    parser.add_argument("--repeat", type=int, default=5, help="runs of (d) or (e)")
    parser.add_argument("--worker", type=int, metavar="N", help="only (d), over N records")
    parser.add_argument("--open", type=int, metavar="N", help="only (f), N opens and closes")
    parser.add_argument("--one-job", nargs=4, metavar=("LOG", "DIR", "STORE", "OUTPUT"))
    args = parser.parse_args()
    if args.one_job:  # a child: one job, its figures as JSON on the last line
        log_url, data_dir, store, output = args.one_job
        found = job(
            log_url, Path(data_dir), store, args.job_events, args.per_trigger, output, args.scope
        )
        print(json.dumps(found))
        return
    if args.task:
        print(f"machine: {platform.platform()}, load {os.getloadavg()[0]:.1f}")
        print("\n| values | scope | records per CPU second (runs) | median | µs per record |")
        print("| --- | --- | --- | ---: | ---: |")
        for (layout, scope), found in task_rates(args.task).items():
            median = statistics.median(found)
            runs = ", ".join(f"{r:,.0f}" for r in found)
            print(f"| {layout} | {scope} | {runs} | {median:,.0f} | {1e6 / median:.2f} |")
        return
    if args.suppress:
        print(f"machine: {platform.platform()}, load {os.getloadavg()[0]:.1f}")
        print("\n| suppression | records per CPU second (runs) | median | µs per record |")
        print("| --- | --- | ---: | ---: |")
        for way, found in suppress_rates(args.suppress).items():
            median = statistics.median(found)
            runs = ", ".join(f"{r:,.0f}" for r in found)
            print(f"| {way} | {runs} | {median:,.0f} | {1e6 / median:.2f} |")
        return
    if args.worker or args.write or args.open:
        print(f"machine: {platform.platform()}, load {os.getloadavg()[0]:.1f}")
        if args.worker:
            costs, heading = worker_costs(args.worker, args.repeat), "CPU µs per record"
        elif args.open:
            costs, heading = open_costs(args.open, args.batch * 3), "ms"
        else:
            costs, heading = write_costs(args.write, args.repeat), "µs per key"
        print(f"\n| part | {heading} (runs) | median |")
        print("| --- | --- | ---: |")
        for name, found in costs.items():
            runs = ", ".join(f"{r:.2f}" for r in found)
            print(f"| {name} | {runs} | {statistics.median(found):.2f} |")
        return
    root = Path(tempfile.mkdtemp(prefix="exactly-bench-dedupe-"))
    os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:+UseParallelGC")
    try:
        load = os.getloadavg()[0]
        print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {load:.1f}")
        a = store_layer(args.events, args.batch, root / "store", args.window)
        print(
            "\n| store | window | claims | duplicates | kept keys | generations "
            "| claims/s (1 core) | B/key written | B/key compacted |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        print(
            f"| rocksdb | {args.window} | {a['claims']:,} | {a['duplicates']:,} | {a['keys']:,} "
            f"| {a['generations']} | {a['claims_per_s']:,.0f} | "
            f"{a['bytes_per_key_written']:.1f} | {a['bytes_per_key_compacted']:.1f} |"
        )
        if args.skip_job:
            return
        log_url = f"sqlite://{root / 'log'}"
        began = time.perf_counter()
        fill_raw(log_url, args.job_events)
        print(
            f"\nraw filled with {args.job_events:,} events in {time.perf_counter() - began:.0f} s"
        )
        results = []
        for n, store in enumerate(["rocksdb", "spark-state", "spark-state", "rocksdb"]):
            child = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--job-events",
                    str(args.job_events),
                    "--per-trigger",
                    str(args.per_trigger),
                    "--scope",
                    args.scope,
                    "--one-job",
                    log_url,
                    str(root / f"data-{n}"),
                    store,
                    f"events-{n}",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        print("\n| store | events | passed | seconds | events/s | steady events/s | batches |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in results:
            print(
                f"| {r['store']} | {r['events']:,} | {r['passed']:,} | {r['seconds']:.0f} | "
                f"{r['events_per_s']:,.0f} | {r['steady_per_s']:,.0f} | {r['batches']} |"
            )
        medians = {
            store: statistics.median(r["events_per_s"] for r in results if r["store"] == store)
            for store in ("rocksdb", "spark-state")
        }
        ratio = medians["rocksdb"] / medians["spark-state"]
        print(
            f"\nmedian events/s: rocksdb {medians['rocksdb']:,.0f}, spark-state "
            f"{medians['spark-state']:,.0f}; ratio {ratio:.2f}; load after {os.getloadavg()[0]:.1f}"
        )
        passed = {r["passed"] for r in results}
        if len(passed) > 1:  # every store sees the same events in the same window
            sys.exit(f"the stores disagree on what passes: {sorted(passed)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
