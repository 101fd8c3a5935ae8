"""One SQLite file per topic or one per partition? Measures both layouts with the log's protocol.

    .venv/bin/python bench/log_layout.py [--repeat 3]

Both layouts use the sqlite log's commit protocol (flock, BEGIN IMMEDIATE, insert, COMMIT with
synchronous=NORMAL, fdatasync of the WAL outside the lock), 300-byte records, 8 partitions:

* spread: one writer, requests of 100 records spread over all partitions (the collector's case).
  Per topic that is one transaction and one fsync per request; per partition, eight.
* owned: 4 processes, each appending batches of 100 to partitions of its own (the Spark sink's
  case, one task per output partition). Per partition, writers never share a lock.
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

PARTITIONS = 8
VALUE = b"x" * 300


class File:
    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, ts INT, value BLOB)"
        )
        self.lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT)
        self.path = path
        self.wal: int | None = None

    def append(self, batches: dict[int, int]) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            for partition, count in batches.items():
                low = partition << 40
                (top,) = self.conn.execute(
                    "SELECT max(id) FROM records WHERE id >= ? AND id < ?", (low, low + (1 << 40))
                ).fetchone()
                first = low if top is None else top + 1
                self.conn.executemany(
                    "INSERT INTO records VALUES (?, 0, ?)",
                    [(first + n, VALUE) for n in range(count)],
                )
            self.conn.execute("COMMIT")
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
        if self.wal is None:
            self.wal = os.open(f"{self.path}-wal", os.O_RDONLY)
        os.fdatasync(self.wal)


def files_for(directory: Path, layout: str) -> dict[int, File]:
    if layout == "topic":
        one = File(directory / "topic.sqlite")
        return dict.fromkeys(range(PARTITIONS), one)
    return {p: File(directory / f"p{p}.sqlite") for p in range(PARTITIONS)}


def spread(directory: Path, layout: str, requests: int) -> float:
    files = files_for(directory, layout)
    began = time.perf_counter()
    for _ in range(requests):
        by_file: dict[File, dict[int, int]] = {}
        for partition in range(PARTITIONS):
            count = 100 // PARTITIONS + (partition < 100 % PARTITIONS)
            by_file.setdefault(files[partition], {})[partition] = count
        for file, batches in by_file.items():
            file.append(batches)
    return requests * 100 / (time.perf_counter() - began)


def owner(directory: Path, layout: str, worker: int, batches: int, start: float) -> None:
    files = files_for(directory, layout)
    mine = [p for p in range(PARTITIONS) if p % 4 == worker]
    while time.time() < start:
        time.sleep(0.001)
    for n in range(batches):
        partition = mine[n % len(mine)]
        files[partition].append({partition: 100})


def owned(directory: Path, layout: str, batches: int) -> float:
    files_for(directory, layout)  # create the schema before the workers race
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 1.5
    procs = [
        ctx.Process(target=owner, args=(directory, layout, w, batches, start)) for w in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return 4 * batches * 100 / (time.time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| workload | per topic (records/s) | per partition (records/s) | ratio |")
    print("| --- | --- | --- | --- |")
    for name, run in (
        (
            "spread: 1 writer, 100-record requests over 8 partitions",
            lambda d, layout: spread(d, layout, 300),
        ),
        (
            "owned: 4 processes, batches of 100 to their own partitions",
            lambda d, layout: owned(d, layout, 150),
        ),
    ):
        rates = {}
        for layout in ("topic", "partition"):
            samples = []
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory() as scratch:
                    samples.append(run(Path(scratch), layout))
            rates[layout] = statistics.median(samples)
        ratio = rates["topic"] / rates["partition"]
        print(f"| {name} | {rates['topic']:,.0f} | {rates['partition']:,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
