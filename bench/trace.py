"""``exactly trace`` at scale, and what its index by messageId costs per event.

    .venv/bin/python bench/trace.py [--events 10000000] [--cost-events 1000000] [--cost-only]

1. **Cost.** The same records (a collector-like 330-byte JSON value, groups of 1,000 records
   over 8 partitions per ``append_many``, as the collector's appender makes them) appended to
   two topics through the log API: ``keyed`` with a UUID messageId as key (stored, and hashed
   into ``batch_keys`` for the lookup), and ``unkeyed`` without. They are appended in chunks of
   20,000 in turn, in the same run; reported: records/s of each (median of the chunks' rates)
   and bytes on disk per record after a WAL checkpoint (the difference holds the 36-byte key).
2. **Latency.** ``raw`` with ``--events`` records and ``events`` with one record per raw record
   (its source offset in a header, as the dedupe job writes), written directly through the log
   API (no HTTP); an aggregate database with 1,200 micro-batch markers over ``events`` and a
   JobDB with two jobs for each traced id and for 100,000 others; then
   :func:`exactly.trace.trace` of 200 ids present and 200 unknown, each
   timed from the call to its return (opening the log included), in a fresh process.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import orjson

from exactly.events.partition import partition_for
from exactly.log import Record, open_log

PARTITIONS = 8
GROUP = 1_000
SOURCE_HEADER = "exactly.source.offset"


def value_of(message_id: str, n: int) -> bytes:
    """About 330 bytes, shaped like what the collector stores."""
    return orjson.dumps(
        {
            "type": "track",
            "event": "Order Completed",
            "messageId": message_id,
            "userId": f"user-{n % 100_000}",
            "properties": {"revenue": 19.99, "currency": "EUR", "plan": "pro"},
            "context": {"library": {"name": "analytics.js", "version": "5.2.0"}},
            "timestamp": "2026-11-23T20:00:00.000Z",
            "receivedAt": "2026-11-23T20:00:00.123Z",
            "sentAt": "2026-11-23T20:00:00.100Z",
            "originalTimestamp": "2026-11-23T20:00:00.000Z",
            "sourceId": "web",
        }
    )


def message_id(n: int) -> str:
    return str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15 + 12345) % (1 << 128), version=4))


def group(start: int, count: int) -> dict[int, list[Record]]:
    batches: dict[int, list[Record]] = {}
    for n in range(start, start + count):
        mid = message_id(n)
        p = partition_for(mid, PARTITIONS)
        batches.setdefault(p, []).append(Record(value_of(mid, n), mid.encode()))
    return batches


def disk_bytes(directory: Path, topic: str) -> int:
    path = directory / f"{topic}.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(f.stat().st_size for f in directory.glob(f"{topic}.sqlite*"))


def cost(directory: Path, events: int) -> dict[str, float]:
    url = f"sqlite://{directory}"
    rates: dict[str, list[float]] = {"keyed": [], "unkeyed": []}
    with open_log(url) as log:
        for topic in rates:
            log.create_topic(topic, PARTITIONS)
        chunk = 20 * GROUP
        for start in range(0, events, chunk):
            groups = [group(start + g, GROUP) for g in range(0, chunk, GROUP)]
            unkeyed = [
                {p: [Record(r.value) for r in records] for p, records in batches.items()}
                for batches in groups
            ]
            turn = (start // chunk) % len(rates)
            order = list(rates)[turn:] + list(rates)[:turn]  # each goes first in turn
            for topic in order:
                began = time.perf_counter()
                for batches in groups if topic == "keyed" else unkeyed:
                    log.append_many(topic, batches)
                rates[topic].append(chunk / (time.perf_counter() - began))
    found = {f"{topic} records/s": statistics.median(r) for topic, r in rates.items()}
    for topic in rates:
        found[f"{topic} bytes/record"] = disk_bytes(directory, topic) / events
    return found


def sample(events: int) -> tuple[list[str], list[str]]:
    """200 ids in raw and 200 that are nowhere, the same in every run."""
    import random

    rng = random.Random(7)
    present = [message_id(n) for n in rng.sample(range(events), 200)]
    absent = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(200)]
    return present, absent


def build_stores(data: Path, ends: dict[int, int], traced: list[str]) -> None:
    """The aggregate database with 1,200 markers over ``events`` (1,000 kept) and a JobDB with
    two jobs (two destinations) per traced id and per 100,000 other ids: three datasets."""
    from exactly.aggregate import Batch, open_db
    from exactly.delivery.jobdb import open_jobdb
    from exactly.delivery.jobdb.base import EXECUTING, SUCCEEDED, NewJob, Transition

    batches = 1_200
    with open_db(f"sqlite://{data / 'aggregates.db'}") as db:
        db.prepare([], "bench", True)
        for b in range(batches):
            at = {p: end * (b + 1) // batches for p, end in ends.items()}
            db.commit(Batch("bench-query", b, "bench", "events", at, {}, 1), [])
    ids = traced + [message_id(-n) for n in range(1, 100_001)]
    with open_jobdb(f"sqlite://{data / 'jobdb'}") as jobdb:
        for start in range(0, len(ids), 10_000):
            jobs = [
                NewJob("web", name, b"{}", mid)
                for mid in ids[start : start + 10_000]
                for name in ("warehouse", "crm")
            ]
            jobdb.add(jobs, query_id="bench-route", batch_id=start)
        now = time.time()
        steps = []
        for mid in traced:
            for job, _ in jobdb.jobs_with(mid):
                steps += [
                    Transition(job.id, EXECUTING, 1, now),
                    Transition(job.id, SUCCEEDED, 1, now + 0.03, None, 200),
                ]
        jobdb.record(steps)


def build(directory: Path, events: int) -> float:
    """``raw`` and ``events`` with ``events`` records each; seconds taken."""
    began = time.perf_counter()
    with open_log(f"sqlite://{directory}") as log:
        log.create_topic("raw", PARTITIONS)
        log.create_topic("events", PARTITIONS)
        for start in range(0, events, 10 * GROUP):
            batches = group(start, 10 * GROUP)
            results = log.append_many("raw", batches)
            kept = {
                p: [
                    Record(r.value, r.key, ((SOURCE_HEADER, str(offset).encode()),))
                    for r, offset in zip(records, results[p].offsets, strict=True)
                ]
                for p, records in batches.items()
            }
            log.append_many("events", kept)
            if start % 1_000_000 == 0:
                print(f"  {start:,} written", file=sys.stderr, flush=True)
    return time.perf_counter() - began


LATENCY = """
import json, statistics, sys, time
sys.path.insert(0, {src!r})
from exactly.config import Settings
from exactly.trace import trace
settings = Settings(data_dir={data!r})
present, absent = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {{}}
for name, ids in (("present", present), ("unknown", absent)):
    times = []
    for mid in ids:
        began = time.perf_counter()
        found = trace(settings, mid)
        times.append(time.perf_counter() - began)
        assert found.found == (name == "present"), mid
        if name == "present":
            assert found.copies[0].verdict.outcome == "kept", found.to_json()
            assert found.counted[0].batch_id is not None, found.to_json()
            assert len(found.deliveries) == 2, found.to_json()
    times.sort()
    out[name] = {{"median": statistics.median(times), "p99": times[int(len(times) * 0.99) - 1],
                 "max": times[-1]}}
print(json.dumps(out))
"""


def latency(data: Path, events: int) -> dict[str, dict[str, float]]:
    import json

    present, absent = sample(events)
    script = LATENCY.format(src=str(Path(__file__).resolve().parents[1] / "src"), data=str(data))
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(present), json.dumps(absent)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        sys.exit(f"the traces failed:\n{done.stderr[-3000:]}")
    found: dict[str, dict[str, float]] = json.loads(done.stdout)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--cost-events", type=int, default=1_000_000)
    parser.add_argument("--cost-only", action="store_true", help="skip the latency part")
    parser.add_argument("--dir", type=Path, default=None, help="keep the data here")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="exactly-trace-"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}")
    print(f"load average at start: {os.getloadavg()}")
    if args.cost_events:
        found = cost(root / "cost", args.cost_events)
        print(f"| {args.cost_events:,} records | records/s | bytes on disk / record |")
        print("| --- | --- | --- |")
        for topic in ("unkeyed", "keyed"):
            print(
                f"| {topic} | {found[f'{topic} records/s']:,.0f} | "
                f"{found[f'{topic} bytes/record']:.1f} |"
            )
        extra = found["keyed bytes/record"] - found["unkeyed bytes/record"]
        change = found["keyed records/s"] / found["unkeyed records/s"] - 1
        print(f"keys: +{extra:.1f} bytes/record, append throughput {change:+.1%}")
    if args.cost_only:
        return
    data = root / "data"
    log_dir = data / "log"
    if not (log_dir / "raw.sqlite").exists():
        print(f"built raw + events, {args.events:,} each, in {build(log_dir, args.events):.0f} s")
        with open_log(f"sqlite://{log_dir}") as log:
            ends = log.end_offsets("events")
        build_stores(data, ends, sample(args.events)[0])
    conn = sqlite3.connect(log_dir / "raw.sqlite")
    (count,) = conn.execute("SELECT sum(count) FROM batches").fetchone()
    conn.close()
    print(f"raw holds {count:,} records")
    print(f"load average before the traces: {os.getloadavg()}")
    for name, figures in latency(data, count).items():
        print(
            f"trace, id {name}: median {figures['median'] * 1000:.1f} ms, p99 "
            f"{figures['p99'] * 1000:.1f} ms, max {figures['max'] * 1000:.1f} ms"
        )
    print(f"load average at end: {os.getloadavg()}; data in {root}")


if __name__ == "__main__":
    main()
