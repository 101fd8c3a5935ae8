"""The sqlite log's files: the schema, rowids as positions, the headers' encoding, connections.

A record's rowid is ``partition << OFFSET_BITS | offset``: a partition is a contiguous rowid
range (:func:`partition_range`). Headers are stored as one blob (:func:`encode_headers`).
Keyed records are indexed by key (index ``records_by_key``): the key is the messageId on ``raw``,
``events`` and ``raw.rejected``, so ``exactly trace`` finds a message without a scan. The index
leads with the record's bucket of 512 offsets (``id >> KEY_BUCKET_BITS``), so an append touches
only the few index pages of its partitions' newest buckets instead of one random page per record
(messageIds are random): a lookup probes each bucket of the partition, one b-tree search each.
A topic created before the index existed gets it the next time a writer creates the topic with
``exist_ok`` (the collector and the dedupe job do at start), built once under the write lock;
until then a lookup scans the partition (docs/design.md, "The trace index"). (``records_key``,
on the key alone, was the first form: dropped, as its random inserts cost a third of the
append throughput at a million records, twice what this one costs: docs/benchmarks.md.)
"""

from __future__ import annotations

import itertools
import sqlite3
import struct
import time
from collections.abc import Sequence
from pathlib import Path

from exactly.backoff import backoff
from exactly.log.base import Header

OFFSET_BITS = 40
KEY_BUCKET_BITS = 9  # the index by key leads with id >> 9: see the module docstring
SUFFIX = ".sqlite"
BUSY_TIMEOUT = 60  # seconds a connection waits for another's lock before failing

WRITERS_TABLE = """CREATE TABLE IF NOT EXISTS writers (
    writer TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (writer, partition)) WITHOUT ROWID"""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS topic (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, key BLOB, value BLOB NOT NULL,
    headers BLOB);
DROP INDEX IF EXISTS records_key;
CREATE INDEX IF NOT EXISTS records_by_key ON records (id >> 9, key) WHERE key IS NOT NULL;
CREATE TABLE IF NOT EXISTS producers (
    producer TEXT NOT NULL, partition INTEGER NOT NULL, last_sequence INTEGER NOT NULL,
    PRIMARY KEY (producer, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, partition)) WITHOUT ROWID;
"""
    + WRITERS_TABLE
)

_HEADER = struct.Struct(">HI")


def encode_headers(headers: Sequence[Header]) -> bytes | None:
    """Headers as ``(u16 name length, u32 value length, name, value)*``; None when empty."""
    if not headers:
        return None
    if len(headers) == 1:  # the common case (the sink's mark): no list to build
        name, value = headers[0]
        raw = name.encode()
        return _HEADER.pack(len(raw), len(value)) + raw + bytes(value)
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode()
        parts += [_HEADER.pack(len(raw), len(value)), raw, bytes(value)]
    return b"".join(parts)


def decode_headers(blob: bytes | None) -> tuple[Header, ...]:
    if not blob:
        return ()
    headers: list[Header] = []
    at = 0
    while at < len(blob):
        name_len, value_len = _HEADER.unpack_from(blob, at)
        at += _HEADER.size
        name = blob[at : at + name_len].decode()
        at += name_len
        headers.append((name, blob[at : at + value_len]))
        at += value_len
    return tuple(headers)


def partition_range(partition: int) -> tuple[int, int]:
    """The rowids ``[low, high)`` a partition occupies."""
    return partition << OFFSET_BITS, (partition + 1) << OFFSET_BITS


def connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT * 1000}")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
    else:
        _write_ahead(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def _write_ahead(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode, waiting out other processes doing the same to a new file.

    Switching reads the header and then upgrades to a write transaction; SQLite answers that
    upgrade ``database is locked`` at once, without its busy handler (waiting could deadlock), when
    another connection holds the write lock. So the first writers of a new file (a job's tasks
    starting together) race here: the losers retry, within the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT
    for attempt in itertools.count(1):
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
        time.sleep(backoff(attempt, minimum=0.001, maximum=0.1))


def partitions_of(conn: sqlite3.Connection) -> int | None:
    """The topic's partition count; None while the topic is not created."""
    try:
        row = conn.execute("SELECT partitions FROM topic").fetchone()
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        return None
    return None if row is None else int(row[0])
