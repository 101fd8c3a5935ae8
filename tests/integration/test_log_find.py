"""The sqlite log's record batches: lookup by key (``Log.find``) through the batches' key hashes,
and topics of an earlier version (one row per record) converted when first opened."""

from __future__ import annotations

import itertools
import sqlite3
import zlib
from pathlib import Path

import pytest

from exactly.log import Record, open_log
from exactly.log.sqlite_format import BATCH_BYTES


def colliding_keys() -> tuple[bytes, bytes]:
    """Two keys with the same CRC-32 (what ``batch_keys`` holds)."""
    seen: dict[int, bytes] = {}
    for n in itertools.count():
        key = b"m-%d" % n
        other = seen.setdefault(zlib.crc32(key), key)
        if other != key:
            return other, key
    raise AssertionError("unreachable")


def test_find_returns_every_record_of_a_key_across_batches_in_its_partition(
    tmp_path: Path,
) -> None:
    twin, key = colliding_keys()
    with open_log(f"sqlite://{tmp_path}") as log:
        log.create_topic("raw", 2)
        for start in range(0, 3_000, 500):  # six appends, six batches
            keys = [b"hot" if n % 700 == 0 else b"k%d" % n for n in range(start, start + 500)]
            log.append("raw", 1, [Record(b"v%d" % n, key) for n, key in enumerate(keys, start)])
        log.append("raw", 0, [Record(b"other", b"hot")])
        log.append("raw", 1, [Record(b"no key"), Record(b"twin", twin), Record(b"key", key)])
        found = log.find("raw", 1, b"hot")
        assert found is not None
        assert [r.offset for r in found] == [0, 700, 1400, 2100, 2800]
        assert [r.value for r in found] == [b"v0", b"v700", b"v1400", b"v2100", b"v2800"]
        assert [r.offset for r in log.find("raw", 1, b"k2999") or []] == [2999]
        assert log.find("raw", 1, b"absent") == []
        assert [r.value for r in log.find("raw", 0, b"hot") or []] == [b"other"]
        # the same hash, in the same batch: only the key asked for
        assert [r.value for r in log.find("raw", 1, key) or []] == [b"key"]
        assert [r.value for r in log.find("raw", 1, twin) or []] == [b"twin"]


def test_a_large_append_is_split_into_batches_and_reads_back_from_any_offset(
    tmp_path: Path,
) -> None:
    value = b"x" * 10_000
    count = 3 * BATCH_BYTES // len(value) + 7  # three batches and a bit
    with open_log(f"sqlite://{tmp_path}") as log:
        log.create_topic("t", 1)
        records = [Record(value + b"%d" % n, b"k%d" % n, (("h", b"%d" % n),)) for n in range(count)]
        assert log.append("t", 0, records).offsets == list(range(count))
        with sqlite3.connect(tmp_path / "t.sqlite") as conn:
            (batches,) = conn.execute("SELECT count(*) FROM batches").fetchone()
        assert batches == 4
        for offset in (0, 1, 104, 105, 106, count - 1):
            (first,) = log.read("t", 0, offset, max_records=1)
            assert first.offset == offset and first.key == b"k%d" % offset
            assert first.value == value + b"%d" % offset and first.headers == (
                ("h", b"%d" % offset),
            )
        read = log.read("t", 0, 100, max_records=count)
        assert [r.offset for r in read] == list(range(100, count))
        assert [r.offset for r in log.find("t", 0, b"k%d" % (count - 2)) or []] == [count - 2]


OLD_SCHEMA = """
CREATE TABLE topic (name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE records (
    id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, key BLOB, value BLOB NOT NULL,
    headers BLOB);
CREATE INDEX records_by_key ON records (id >> 9, key) WHERE key IS NOT NULL;
CREATE TABLE producers (
    producer TEXT NOT NULL, partition INTEGER NOT NULL, last_sequence INTEGER NOT NULL,
    PRIMARY KEY (producer, partition)) WITHOUT ROWID;
CREATE TABLE group_offsets (
    grp TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, partition)) WITHOUT ROWID;
"""


def write_old_topic(path: Path, partitions: int, rows: dict[int, int]) -> None:
    """A topic as the version with one row per record wrote it: ``rows[p]`` records in ``p``,
    keyed, with a header and a timestamp each."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(OLD_SCHEMA)
    conn.execute("INSERT INTO topic VALUES ('t', ?)", (partitions,))
    for partition, count in rows.items():
        conn.executemany(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?)",
            [
                (
                    (partition << 40) + n,
                    1_700_000_000_000 + n,
                    None if n % 5 == 0 else b"key-%d-%d" % (partition, n),
                    b"value-%d-%d" % (partition, n),
                    None if n % 3 else b"\x00\x04\x00\x00\x00\x01markx",  # ("mark", b"x")
                )
                for n in range(count)
            ],
        )
    conn.execute("INSERT INTO producers VALUES ('p', 0, 41)")
    conn.execute("INSERT INTO group_offsets VALUES ('g', 1, 7)")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("first", ["reader", "writer"])
def test_a_topic_of_one_row_per_record_is_converted_when_first_opened(
    tmp_path: Path, first: str
) -> None:
    rows = {0: 2_500, 1: 3, 2: 0}
    write_old_topic(tmp_path / "t.sqlite", 3, rows)
    with open_log(f"sqlite://{tmp_path}") as log:
        if first == "writer":
            log.create_topic("t", 3, exist_ok=True)  # what the collector does at start
        assert log.end_offsets("t") == rows
        for partition, count in rows.items():
            read = log.read("t", partition, 0, max_records=10_000)
            assert [r.offset for r in read] == list(range(count))
            for n, record in enumerate(read):
                assert record.value == b"value-%d-%d" % (partition, n)
                assert record.key == (None if n % 5 == 0 else b"key-%d-%d" % (partition, n))
                assert record.timestamp == 1_700_000_000_000 + n
                assert record.headers == (() if n % 3 else (("mark", b"x"),))
        assert [r.offset for r in log.find("t", 0, b"key-0-2499") or []] == [2499]
        assert log.last_sequence("t", 0, "p") == 41
        assert log.committed_offsets("g", "t") == {1: 7}
        assert log.append("t", 1, [Record(b"after")]).offsets == [3]
    with sqlite3.connect(tmp_path / "t.sqlite") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "records" not in tables and "records_by_key" not in tables
