"""A route micro-batch's job rows into SQLite, a row a step or many rows a statement, alone and
beside a thread busy in Python; then the director's paging of them.

    .venv/bin/python bench/gil_inserts.py [--rows 50000] [--per-statement 1000] [--repeat 3]

Python's sqlite3 gives up the GIL around each ``sqlite3_step``; when another thread of the
process is running Python, the stepping thread then waits for it to let go (up to
``sys.getswitchinterval()``, 5 ms) before each next row. The route query shares its driver
with the other queries, and the director its process with its event loop. Each case: a new WAL
database with a ``jobs_N`` table as the JobDB makes it (primary key and ``(bucket, id)``
index), ``--rows`` rows of about 300 B in one transaction, committed; the wall time of the
insert and commit, the median of ``--repeat``. The busy thread counts to keep the GIL wanted.
Last, the rows read back in pages of 1,000 as the director pages a bucket (each fetched row is a
step too), alone and beside the busy thread.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import chain, repeat
from pathlib import Path

Row = tuple[int, str, str, bytes, str, str, float, float, int]


def rows(count: int) -> list[Row]:
    payload = b'{"messageId":"m","pad":"' + b"x" * 270 + b'"}'
    return [
        (i, "web/all", "all", payload, f"m{i}", f"u{i % 997}", 1.0, 2.0, 1) for i in range(count)
    ]


@contextmanager
def busy_thread(on: bool) -> Iterator[None]:
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    thread = threading.Thread(target=spin, daemon=True)
    if on:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if on:
            thread.join()


def insert(path: Path, made: list[Row], per_statement: int) -> float:
    """Seconds to insert and commit ``made`` (``per_statement`` 0: ``executemany``)."""
    connection = sqlite3.connect(path, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute(
        "CREATE TABLE jobs_1 (id INTEGER PRIMARY KEY, bucket TEXT NOT NULL, destination TEXT "
        "NOT NULL, payload BLOB NOT NULL, message_id TEXT NOT NULL, user_id TEXT, created_at "
        "REAL NOT NULL, expire_at REAL NOT NULL, events INTEGER NOT NULL)"
    )
    connection.execute("CREATE INDEX jobs_1_bucket ON jobs_1 (bucket, id)")
    marks = "(?, ?, ?, ?, ?, ?, ?, ?, ?)"
    start = time.perf_counter()
    connection.execute("BEGIN IMMEDIATE")
    if per_statement:
        for at in range(0, len(made), per_statement):
            chunk = made[at : at + per_statement]
            connection.execute(
                f"INSERT INTO jobs_1 VALUES {', '.join(repeat(marks, len(chunk)))}",
                list(chain.from_iterable(chunk)),
            )
    else:
        connection.executemany(f"INSERT INTO jobs_1 VALUES {marks}", made)
    connection.execute("COMMIT")
    took = time.perf_counter() - start
    connection.close()
    return took


def page_all(path: Path) -> float:
    """Seconds to read every row of ``path``'s table in pages of 1,000 by id."""
    connection = sqlite3.connect(path, isolation_level=None)
    start = time.perf_counter()
    after = 0
    while True:
        page = connection.execute(
            "SELECT * FROM jobs_1 WHERE bucket = ? AND id > ? ORDER BY id LIMIT 1000",
            ("web/all", after),
        ).fetchall()
        if not page:
            break
        after = page[-1][0]
    took = time.perf_counter() - start
    connection.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--per-statement", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    made = rows(args.rows)
    print(f"{args.rows:,} rows, switch interval {1000 * sys.getswitchinterval():g} ms")
    with tempfile.TemporaryDirectory(prefix="exactly-gil-") as work:
        for busy in (False, True):
            for per in (0, args.per_statement):
                times = []
                for attempt in range(args.repeat):
                    path = Path(work) / f"{busy}-{per}-{attempt}.sqlite"
                    with busy_thread(busy):
                        times.append(insert(path, made, per))
                how = "executemany" if not per else f"{per:,} rows a statement"
                beside = "beside a busy thread" if busy else "alone"
                print(f"{how:>24} {beside:>21}: {statistics.median(times):.3f} s", flush=True)
        path = Path(work) / "False-0-0.sqlite"
        for busy in (False, True):
            times = []
            for _ in range(args.repeat):
                with busy_thread(busy):
                    times.append(page_all(path))
            beside = "beside a busy thread" if busy else "alone"
            print(f"{'read in pages of 1,000':>24} {beside:>21}: {statistics.median(times):.3f} s")


if __name__ == "__main__":
    main()
