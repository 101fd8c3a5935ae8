"""Rows or record batches? What each layout of a sqlite topic costs to append, read and search.

    .venv/bin/python bench/record_batches.py [--records 400000] [--repeat 3]

The sqlite log stores one SQLite row per record, indexed by key (``records_by_key``) for
``exactly trace``. A record-batch layout (as Kafka stores them) would store one row per append
to a partition, with the records packed in one blob. This measures three layouts in SQLite
itself, with the log's ids (``partition << 40 | offset``) and 36-byte keys (messageIds), 300-byte
values, batches of 1,000 over 8 partitions, in WAL mode without fsync (it is the same for all):

* ``rows``: today's table and index;
* ``batches+keys``: a row per batch, and a key table ``(bucket, key, id)``, one entry a record,
  so a key is found by b-tree searches as today;
* ``batches+hashes``: a row per batch, and beside it the batch's keys as 8-byte hashes (one
  blob a batch), so a key is found by scanning its partition's hashes (numpy), then decoding the
  batches that hold a match.

For each: append cost per record, reading a partition (records/s, decoded to Python objects),
and finding one key in a partition of ``--records`` records (ms). The plain ``executemany`` of
bench/log_throughput.py's baseline runs alongside. Medians of ``--repeat``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import struct
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

PARTITIONS = 8
BATCH = 1000
VALUE = b"x" * 300
ENTRY = struct.Struct(">qiI")  # timestamp, key length (-1: none), value length; then the bytes


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _hashes(keys: list[bytes]) -> bytes:
    """8 bytes of each key (messageIds are random: their first hex digits are hash enough)."""
    return b"".join(key[:8] for key in keys)


def pack(keys: list[bytes], values: list[bytes]) -> bytes:
    return b"".join(
        ENTRY.pack(0, len(key), len(value)) + key + value
        for key, value in zip(keys, values, strict=True)
    )


def unpack(blob: bytes) -> list[tuple[bytes, bytes, int]]:
    found, at, size, end = [], 0, ENTRY.size, len(blob)
    while at < end:
        timestamp, key_length, value_length = ENTRY.unpack_from(blob, at)
        at += size
        key = blob[at : at + key_length]
        at += key_length
        found.append((key, blob[at : at + value_length], timestamp))
        at += value_length
    return found


class Layout:
    name = ""
    ddl: tuple[str, ...] = ()

    def __init__(self, path: Path) -> None:
        self.conn = _connect(path)
        for statement in self.ddl:
            self.conn.execute(statement)
        self.next = [p << 40 for p in range(PARTITIONS)]

    def append(self, partition: int, keys: list[bytes], values: list[bytes]) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        first = self.next[partition]
        self.insert(first, keys, values)
        self.conn.execute("COMMIT")
        self.next[partition] = first + len(keys)

    def insert(self, first: int, keys: list[bytes], values: list[bytes]) -> None:
        raise NotImplementedError

    def read(self, partition: int) -> Iterator[tuple[bytes, bytes, int]]:
        raise NotImplementedError

    def find(self, partition: int, key: bytes) -> list[int]:
        raise NotImplementedError


class Rows(Layout):
    name = "rows"
    ddl = (
        "CREATE TABLE records (id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, key BLOB,"
        " value BLOB NOT NULL, headers BLOB)",
        "CREATE INDEX records_by_key ON records (id >> 9, key) WHERE key IS NOT NULL",
    )

    def insert(self, first: int, keys: list[bytes], values: list[bytes]) -> None:
        self.conn.executemany(
            "INSERT INTO records VALUES (?, 0, ?, ?, NULL)",
            zip(range(first, first + len(keys)), keys, values, strict=True),
        )

    def read(self, partition: int) -> Iterator[tuple[bytes, bytes, int]]:
        low, at = partition << 40, partition << 40
        while rows := self.conn.execute(
            "SELECT id, key, value, timestamp FROM records WHERE id >= ? AND id < ?"
            " ORDER BY id LIMIT 5000",
            (at, low + (1 << 40)),
        ).fetchall():
            yield from ((key, value, ts) for _, key, value, ts in rows)
            at = rows[-1][0] + 1

    def find(self, partition: int, key: bytes) -> list[int]:
        low, high = partition << 40, self.next[partition]
        rows = self.conn.execute(
            "WITH RECURSIVE bucket(b) AS (SELECT ? UNION ALL SELECT b + 1 FROM bucket"
            " WHERE b < ?) SELECT r.id FROM bucket CROSS JOIN records r ON (r.id >> 9) ="
            " bucket.b AND r.key = ? AND r.key IS NOT NULL WHERE +r.id < ? ORDER BY r.id",
            (low >> 9, (high - 1) >> 9, key, high),
        ).fetchall()
        return [row[0] - low for row in rows]


class Batches(Layout):
    ddl = ("CREATE TABLE batches (id INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB)",)

    def insert(self, first: int, keys: list[bytes], values: list[bytes]) -> None:
        self.conn.execute(
            "INSERT INTO batches VALUES (?, ?, ?)", (first, len(keys), pack(keys, values))
        )

    def read(self, partition: int) -> Iterator[tuple[bytes, bytes, int]]:
        low, at = partition << 40, partition << 40
        while rows := self.conn.execute(
            "SELECT id, data FROM batches WHERE id >= ? AND id < ? ORDER BY id LIMIT 5",
            (at, low + (1 << 40)),
        ).fetchall():
            for _, data in rows:
                yield from unpack(data)
            at = rows[-1][0] + 1

    def _matches(self, first: int, key: bytes) -> list[int]:
        (data,) = self.conn.execute("SELECT data FROM batches WHERE id = ?", (first,)).fetchone()
        return [first + n for n, (k, _, _) in enumerate(unpack(data)) if k == key]


class BatchesWithKeys(Batches):
    name = "batches+keys"
    ddl = (
        *Batches.ddl,
        "CREATE TABLE keys (bucket INTEGER NOT NULL, key BLOB NOT NULL, id INTEGER NOT NULL,"
        " PRIMARY KEY (bucket, key, id)) WITHOUT ROWID",
    )

    def insert(self, first: int, keys: list[bytes], values: list[bytes]) -> None:
        super().insert(first, keys, values)
        self.conn.executemany(
            "INSERT INTO keys VALUES (?, ?, ?)",
            ((at >> 9, key, at) for at, key in enumerate(keys, first)),
        )

    def find(self, partition: int, key: bytes) -> list[int]:
        low, high = partition << 40, self.next[partition]
        rows = self.conn.execute(
            "WITH RECURSIVE bucket(b) AS (SELECT ? UNION ALL SELECT b + 1 FROM bucket"
            " WHERE b < ?) SELECT k.id FROM bucket CROSS JOIN keys k ON k.bucket = bucket.b"
            " AND k.key = ? ORDER BY k.id",
            (low >> 9, (high - 1) >> 9, key),
        ).fetchall()
        return [row[0] - low for row in rows]


class BatchesWithHashes(Batches):
    name = "batches+hashes"
    ddl = (*Batches.ddl, "CREATE TABLE batch_keys (id INTEGER PRIMARY KEY, hashes BLOB NOT NULL)")

    def insert(self, first: int, keys: list[bytes], values: list[bytes]) -> None:
        super().insert(first, keys, values)
        self.conn.execute("INSERT INTO batch_keys VALUES (?, ?)", (first, _hashes(keys)))

    def find(self, partition: int, key: bytes) -> list[int]:
        low = partition << 40
        rows = self.conn.execute(
            "SELECT id, hashes FROM batch_keys WHERE id >= ? AND id < ? ORDER BY id",
            (low, low + (1 << 40)),
        ).fetchall()
        firsts = np.fromiter((row[0] for row in rows), np.int64, len(rows))
        counts = np.fromiter((len(row[1]) // 8 for row in rows), np.int64, len(rows))
        hashes = np.frombuffer(b"".join(row[1] for row in rows), ">u8")
        wanted = np.frombuffer(key[:8], ">u8")[0]
        starts = np.repeat(firsts, counts)
        candidates = sorted(set(starts[hashes == wanted].tolist()))
        found = [at for first in candidates for at in self._matches(first, key)]
        return [at - low for at in found]


LAYOUTS: tuple[type[Layout], ...] = (Rows, BatchesWithKeys, BatchesWithHashes)


def keys_of(count: int) -> list[bytes]:
    return [str(uuid.uuid4()).encode() for _ in range(count)]


def baseline(path: Path, batches: list[list[bytes]]) -> float:
    """Seconds a record for bench/log_throughput.py's plain ``executemany``, same records."""
    conn = _connect(path)
    conn.execute("CREATE TABLE r (id INTEGER PRIMARY KEY, ts INTEGER, key BLOB, value BLOB)")
    began = time.perf_counter()
    for keys in batches:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO r VALUES (NULL, 0, ?, ?)", ((k, VALUE) for k in keys))
        conn.execute("COMMIT")
    return (time.perf_counter() - began) / (len(batches) * BATCH)


def appending(layout: Layout, batches: list[list[bytes]]) -> float:
    """Seconds a record, batches of 1,000 rotating over the partitions."""
    values = [VALUE] * BATCH
    began = time.perf_counter()
    for n, keys in enumerate(batches):
        layout.append(n % PARTITIONS, keys, values)
    return (time.perf_counter() - began) / (len(batches) * BATCH)


def median(measure: Callable[[], float], repeat: int) -> float:
    return statistics.median(measure() for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400_000, help="in the searched partition")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as scratch:
        directory = Path(scratch)
        batches = [keys_of(BATCH) for _ in range(200)]
        rows = []
        appends: dict[str, list[float]] = {layout.name: [] for layout in LAYOUTS}
        bases = []
        for run in range(args.repeat):  # alternating, so each sees the same load
            bases.append(baseline(directory / f"base-{run}", batches))
            for kind in LAYOUTS:
                appends[kind.name].append(
                    appending(kind(directory / f"{kind.name}-{run}"), batches)
                )
        base = statistics.median(bases)
        rows.append(["plain executemany (baseline)", f"{base * 1e6:.2f}", "1.00", "", ""])
        for kind in LAYOUTS:
            layout = kind(directory / f"{kind.name}-search")
            values = [VALUE] * BATCH
            searched = [keys_of(BATCH) for _ in range(args.records // BATCH)]
            for keys in searched:
                layout.append(0, keys, values)
            began = time.perf_counter()
            count = sum(1 for _ in layout.read(0))
            read_rate = count / (time.perf_counter() - began)
            probes = [searched[n][n % BATCH] for n in range(0, len(searched), len(searched) // 5)]
            timings = []
            for key in probes:
                began = time.perf_counter()
                assert len(layout.find(0, key)) == 1
                timings.append(time.perf_counter() - began)
            cost = statistics.median(appends[kind.name])
            rows.append(
                [
                    kind.name,
                    f"{cost * 1e6:.2f}",
                    f"{base / cost:.2f}",
                    f"{read_rate:,.0f}",
                    f"{statistics.median(timings) * 1e3:.1f}",
                ]
            )
    print()
    print(
        "| layout | append, µs a record | baseline / layout | read, records/s |"
        f" find in {args.records:,} records, ms |"
    )
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    cores, python = os.cpu_count(), platform.python_version()
    print(
        f"machine: {platform.platform()}, {cores} cores, Python {python}, SQLite "
        f"{sqlite3.sqlite_version}; load average after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
