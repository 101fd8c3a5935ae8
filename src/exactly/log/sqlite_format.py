"""The sqlite log's files: the schema, record batches, rowids as positions, connections.

Records are stored in batches, as Kafka stores them: one row of ``batches`` per append to a
partition (split at :data:`BATCH_BYTES`), its records packed in one blob (:func:`pack_records`),
its rowid ``partition << OFFSET_BITS | offset of its first record``, so a partition is a
contiguous rowid range and the next offset is the last batch's rowid plus its ``count``. One row
for a thousand records instead of a thousand: SQLite's per-row cost was most of an append
(docs/benchmarks.md, "Record batches").

Keys are found without an index entry per record: ``batch_keys`` holds, per batch with keyed
records, the CRC-32 of each key (4 bytes a key). A lookup scans its partition's hashes and decodes
only the batches holding a match (the key is the messageId on ``raw``, ``events`` and
``raw.rejected``, so ``exactly trace`` finds a message without reading the records).

A topic written by an earlier version (one row per record, table ``records``) is converted to
batches, under the write lock, by the first process that opens it (:func:`convert_rows`).
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exactly.log.base import Header, LogRecord, Record
from exactly.sqlite_wal import write_ahead

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

OFFSET_BITS = 40
BATCH_BYTES = 1 << 20  # an append's records are split into batches of about this size
SUFFIX = ".sqlite"
BUSY_TIMEOUT = 60  # seconds a connection waits for another's lock before failing

WRITERS_TABLE = """CREATE TABLE IF NOT EXISTS writers (
    writer TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (writer, partition)) WITHOUT ROWID"""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS topic (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id INTEGER PRIMARY KEY, count INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS batch_keys (id INTEGER PRIMARY KEY, hashes BLOB NOT NULL);
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
_ENTRY = struct.Struct(">qiIi")  # timestamp, key length (-1: no key), value, headers; then those
_NO_KEY = -1
_ENTRY_FIELDS = [("timestamp", ">i8"), ("key", ">i4"), ("value", ">u4"), ("headers", ">i4")]


def key_hash(key: bytes) -> int:
    """What ``batch_keys`` holds of a key: its CRC-32 (a lookup decodes the batches that match)."""
    return zlib.crc32(key)


def pack_records(records: Sequence[Record], stamp: int) -> tuple[bytes, bytes | None]:
    """A batch's blob, and its keys' hashes (None when no record has a key).

    Each record: ``(i64 timestamp, i32 key length or -1, u32 value length, i32 headers length)``,
    then the key, the value and the headers (:func:`encode_headers`). ``stamp`` is the timestamp
    of records without one.
    """
    parts: list[bytes] = []
    hashes: list[int] = []
    entry = _ENTRY.pack
    for value, key, own, timestamp in records:
        headers = (encode_headers(own) or b"") if own else b""
        if timestamp is None:
            timestamp = stamp
        if key is None:
            parts += (entry(timestamp, _NO_KEY, len(value), len(headers)), value, headers)
        else:
            parts += (entry(timestamp, len(key), len(value), len(headers)), key, value, headers)
            hashes.append(zlib.crc32(key))
    packed_hashes = struct.pack(f"<{len(hashes)}I", *hashes) if hashes else None
    return b"".join(parts), packed_hashes


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """One row of ``batches`` to be: its records packed, and their keys' hashes."""

    count: int
    data: bytes
    hashes: bytes | None


def pack(records: Sequence[Record], stamp: int) -> list[PackedBatch]:
    """``records`` packed as the batches they will be stored as (:func:`batched`).

    Packing needs no offset, so appenders pack before they queue for the write lock, and two
    processes writing one topic pack at once; the lock covers only the inserts.
    """
    return [PackedBatch(len(batch), *pack_records(batch, stamp)) for batch in batched(records)]


def pack_columns(columns: pa.RecordBatch, stamp: int) -> list[PackedBatch]:
    """:func:`pack` of records in Arrow columns (``exactly.log.columns``), in Arrow's kernels.

    The same batches, byte for byte, as :func:`pack` of the same records, without a Python
    object per record: the fixed-size parts are built in numpy, and each record's parts joined
    by ``binary_join_element_wise``.
    """
    import numpy as np

    from exactly.log.columns import lengths

    sizes = np.cumsum(lengths(columns.column("value")) + lengths(columns.column("key")))
    found, start, count = [], 0, columns.num_rows
    while start < count:  # cut as batched() cuts: after the record that reaches BATCH_BYTES
        base = int(sizes[start - 1]) if start else 0
        end = min(int(np.searchsorted(sizes, base + BATCH_BYTES, side="left")) + 1, count)
        part = columns.slice(start, end - start)
        found.append(PackedBatch(part.num_rows, *_pack_part(part, stamp)))
        start = end
    return found


def _pack_part(columns: pa.RecordBatch, stamp: int) -> tuple[bytes, bytes | None]:
    """:func:`pack_records` of records in columns (one batch's)."""
    import numpy as np
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    from exactly.log.columns import lengths

    count = columns.num_rows
    values, keys = columns.column("value"), columns.column("key")
    headers = _encoded_headers(columns.column("headers"))
    entry = np.zeros(
        count, [("timestamp", ">i8"), ("key", ">i4"), ("value", ">u4"), ("headers", ">i4")]
    )
    entry["timestamp"] = pc.fill_null(columns.column("timestamp"), stamp).to_numpy()
    entry["key"] = pc.fill_null(pc.binary_length(keys), _NO_KEY).to_numpy()
    entry["value"] = lengths(values)
    if headers is not None:
        entry["headers"] = lengths(headers)
    parts = [_fixed(entry), pc.fill_null(keys, b""), values]
    if headers is not None:
        parts.append(headers)
    joined = pc.binary_join_element_wise(*parts, b"")
    offsets = np.frombuffer(joined.buffers()[1], np.int32, count + 1, joined.offset * 4)
    low, high = int(offsets[0]), int(offsets[-1])
    blob = joined.buffers()[2][low:high].to_pybytes()
    hashed = [key for key in keys.to_pylist() if key is not None]
    if not hashed:
        return blob, None
    return blob, np.fromiter(map(zlib.crc32, hashed), "<u4", len(hashed)).tobytes()


def _encoded_headers(headers: pa.ListArray) -> pa.Array | None:
    """Each record's headers encoded as :func:`encode_headers` does; None when none has any."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from exactly.log.columns import header_entries, lengths, list_offsets

    entries, counts = header_entries(headers)
    if not len(entries):
        return None
    names = entries.field("key").cast(pa.binary())
    data = pc.fill_null(entries.field("value"), b"")
    fixed = np.zeros(len(entries), [("name", ">u2"), ("value", ">u4")])
    fixed["name"], fixed["value"] = lengths(names), lengths(data)
    encoded = pc.binary_join_element_wise(_fixed(fixed), names, data, b"")
    return pc.binary_join(pa.ListArray.from_arrays(list_offsets(counts), encoded), b"")


def _fixed(rows: np.ndarray) -> pa.Array:
    """A numpy structured array's rows as a binary array, one item per row."""
    import pyarrow as pa

    raw = pa.py_buffer(rows.tobytes())
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(rows.itemsize), len(rows), [None, raw])
    return fixed.cast(pa.binary())


def decode_records(
    blob: bytes, partition: int, offset: int, skip: int, count: int, headers: bool
) -> tuple[list[LogRecord], int]:
    """Up to ``count`` records of a batch from its ``skip``-th on, as :class:`LogRecord` numbered
    from ``offset``, and the bytes of their keys and values (the reader's hot loop). Without
    ``headers``, every record's headers come back empty, undecoded."""
    at, end, size = 0, len(blob), _ENTRY.size
    unpack = _ENTRY.unpack_from
    for _ in range(skip):
        _, key_length, value_length, headers_length = unpack(blob, at)
        at += size + max(key_length, 0) + value_length + headers_length
    new = tuple.__new__  # skips LogRecord's Python-level __new__
    found: list[LogRecord] = []
    append = found.append
    content = 0
    while at < end and count:
        timestamp, key_length, value_length, headers_length = unpack(blob, at)
        at += size
        if key_length < 0:
            key = None
        else:
            key = blob[at : at + key_length]
            at += key_length
        value = blob[at : at + value_length]
        at += value_length
        decoded: tuple[Header, ...] = ()
        if headers_length:
            if headers:
                decoded = decode_headers(blob[at : at + headers_length])
            at += headers_length
        append(new(LogRecord, (partition, offset, key, value, decoded, timestamp)))
        content += value_length + max(key_length, 0)
        offset += 1
        count -= 1
    return found, content


def decode_columns(
    blob: bytes, offset: int, skip: int, count: int, headers: bool
) -> tuple[pa.RecordBatch, np.ndarray]:
    """:func:`decode_records` as Arrow columns (``exactly.log.column_reads.READ``), and each
    record's bytes of key and value.

    Python only steps from one record to the next to find where each starts; the fixed parts
    are read in numpy, and the keys and values cut out of the blob by Arrow's ``take`` (no
    Python object per record). Headers, when asked, are decoded per record that has any.
    """
    import numpy as np
    import pyarrow as pa

    from exactly.log.column_reads import no_headers, read_columns

    starts = _record_starts(blob, skip, count)
    fixed = np.frombuffer(blob, np.uint8)[starts[:, None] + np.arange(_ENTRY.size)]
    entry = fixed.view(np.dtype(_ENTRY_FIELDS)).ravel()
    key_lengths = entry["key"].astype(np.int64)
    key_starts = starts + _ENTRY.size
    value_starts = key_starts + np.maximum(key_lengths, 0)
    value_ends = value_starts + entry["value"].astype(np.int64)
    data = pa.py_buffer(blob)
    keys = _pieces(data, key_starts, value_starts, valid=key_lengths >= 0)
    values = _pieces(data, value_starts, value_ends)
    decoded: list[tuple[Header, ...]] | pa.ListArray | None = None
    if headers:
        header_lengths = entry["headers"].astype(np.int64)
        if not header_lengths.any():  # raw's records: none has headers
            decoded = no_headers(len(starts))
        else:
            ends = value_ends + header_lengths
            decoded = [
                decode_headers(blob[begin:end]) if end > begin else ()
                for begin, end in zip(value_ends.tolist(), ends.tolist(), strict=True)
            ]
    stamps = entry["timestamp"].astype(np.int64)
    positions = np.arange(offset, offset + len(starts), dtype=np.int64)
    return read_columns(positions, keys, values, stamps, decoded), value_ends - key_starts


def _record_starts(blob: bytes, skip: int, count: int) -> np.ndarray:
    """Where each of up to ``count`` records from the ``skip``-th on starts in ``blob``."""
    import numpy as np

    unpack, size = _ENTRY.unpack_from, _ENTRY.size
    at, end = 0, len(blob)
    for _ in range(skip):
        _, key_length, value_length, headers_length = unpack(blob, at)
        at += size + (key_length if key_length > 0 else 0) + value_length + headers_length
    starts: list[int] = []
    append = starts.append
    while at < end and count:
        append(at)
        _, key_length, value_length, headers_length = unpack(blob, at)
        at += size + (key_length if key_length > 0 else 0) + value_length + headers_length
        count -= 1
    return np.array(starts, np.int64)


def _pieces(
    data: pa.Buffer, starts: np.ndarray, ends: np.ndarray, valid: np.ndarray | None = None
) -> pa.BinaryArray:
    """The bytes ``[starts[i], ends[i])`` of ``data`` as a binary array (null where not
    ``valid``): ``data`` seen as the pieces and the gaps between them, the pieces taken."""
    import numpy as np
    import pyarrow as pa

    count = len(starts)
    if not count:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * count, np.int32)  # a blob is under SQLite's 1 GB
    bounds[0::2], bounds[1::2] = starts, ends
    whole = pa.Array.from_buffers(pa.binary(), 2 * count - 1, [None, pa.py_buffer(bounds), data])
    taken = whole.take(pa.array(np.arange(0, 2 * count - 1, 2)))
    if valid is None or valid.all():
        return taken
    mask = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), count, [mask, *taken.buffers()[1:]])


def batched(records: Sequence[Record]) -> Iterator[Sequence[Record]]:
    """``records`` cut into runs of about :data:`BATCH_BYTES` (one batch row each)."""
    start, size = 0, 0
    for index, record in enumerate(records):
        size += len(record.value) + (len(record.key) if record.key is not None else 0)
        if size >= BATCH_BYTES:
            yield records[start : index + 1]
            start, size = index + 1, 0
    if start < len(records):
        yield records[start:] if start else records


def encode_headers(headers: Sequence[Header]) -> bytes | None:
    """Headers as ``(u16 name length, u32 value length, name, value)*``; None when empty."""
    if not headers:
        return None
    if len(headers) <= 2:  # the usual cases (the sink's mark, and the dedupe job's offset)
        encoded = b""
        for name, value in headers:
            packing, length, raw = _NAME_PACKINGS.get(name) or _name_packing(name)
            encoded += packing(length, len(value), raw) + value
        return encoded
    parts: list[bytes] = []
    for name, value in headers:
        packing, length, raw = _NAME_PACKINGS.get(name) or _name_packing(name)
        parts += (packing(length, len(value), raw), value)
    return b"".join(parts)


_NAME_PACKINGS: dict[str, tuple[Callable[..., bytes], int, bytes]] = {}
MAX_NAME_PACKINGS = 1024  # header names whose packing is kept (a name is usually a constant)


def _name_packing(name: str) -> tuple[Callable[..., bytes], int, bytes]:
    """How a header named ``name`` is packed: the struct of its lengths and name, in one call."""
    raw = name.encode()
    if len(_NAME_PACKINGS) >= MAX_NAME_PACKINGS:
        _NAME_PACKINGS.clear()
    found = _NAME_PACKINGS[name] = (struct.Struct(f">HI{len(raw)}s").pack, len(raw), raw)
    return found


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
        write_ahead(conn, BUSY_TIMEOUT)
        conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def partitions_of(conn: sqlite3.Connection) -> int | None:
    """The topic's partition count; None while the topic is not created."""
    try:
        row = conn.execute("SELECT partitions FROM topic").fetchone()
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        return None
    return None if row is None else int(row[0])


def create_tables(conn: sqlite3.Connection) -> None:
    """The schema's tables (those missing), inside the caller's transaction."""
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)


def committed_end(conn: sqlite3.Connection, partition: int) -> int:
    """The rowid after the partition's last record: its last batch's rowid plus its count."""
    low, high = partition_range(partition)
    row = conn.execute(
        "SELECT id + count FROM batches WHERE id >= ? AND id < ? ORDER BY id DESC LIMIT 1",
        (low, high),
    ).fetchone()
    return low if row is None else int(row[0])


def placed(first: int, batches: Sequence[PackedBatch]) -> list[tuple[int, PackedBatch]]:
    """``batches`` of consecutive records with the rowid of each one's first, from ``first``."""
    found = []
    for batch in batches:
        found.append((first, batch))
        first += batch.count
    return found


def insert_batches(conn: sqlite3.Connection, batches: Sequence[tuple[int, PackedBatch]]) -> None:
    """Store each ``(rowid of its first record, packed batch)``."""
    conn.executemany(
        "INSERT INTO batches VALUES (?, ?, ?)", [(at, b.count, b.data) for at, b in batches]
    )
    keyed = [(at, b.hashes) for at, b in batches if b.hashes is not None]
    if keyed:
        conn.executemany("INSERT INTO batch_keys VALUES (?, ?)", keyed)


def has_rows_table(conn: sqlite3.Connection) -> bool:
    """Whether the file still has an earlier version's table of one row per record."""
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'records'"
    ).fetchone()
    return found is not None


def convert_rows(conn: sqlite3.Connection, partitions: int) -> None:
    """Move an earlier version's records (one row each) into batches, in one transaction.

    The caller holds the topic's write lock. Offsets, keys, values, headers and timestamps are
    kept as they were; the old table goes in the same commit, so a crash leaves one or the other.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        create_tables(conn)
        for partition in range(partitions):
            low, high = partition_range(partition)
            at = low
            while rows := conn.execute(
                "SELECT id, timestamp, key, value, headers FROM records"
                " WHERE id >= ? AND id < ? ORDER BY id LIMIT 1000",
                (at, high),
            ).fetchall():
                records = [
                    Record(value, key, decode_headers(headers), timestamp)
                    for _, timestamp, key, value, headers in rows
                ]
                insert_batches(conn, placed(rows[0][0], pack(records, 0)))
                at = rows[-1][0] + 1
        conn.execute("DROP TABLE records")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
