"""The embedded log: one SQLite database per topic under a directory.

Layout: ``DIR/<topic>.sqlite`` holds the topic's partition count, its records in batches (one row
per append to a partition, :mod:`exactly.log.sqlite_format`), the hashes of their keys, the last
sequence of each producer per partition and the consumer-group offsets. A batch's rowid is
``partition << 40 | offset of its first record``, so a partition is a contiguous rowid range: a
read seeks the batch holding its offset and decodes forward, and the next offset is the last
batch's rowid plus its count.
One file per topic (not per partition) because an append that spans partitions, such as a
collector request, then commits with one fsync; ``bench/log_layout.py`` measures the choice.
Beside it, ``DIR/<topic>.lock`` (the write lock) and ``DIR/<topic>.synced`` (the synced watermark).

The commit protocol of one write transaction, group commit and recovery (steps 0-6) live in
:mod:`exactly.log.group_commit`; the files' layout in :mod:`exactly.log.sqlite_format`.

Fenced writers (:meth:`SqliteLog.open_writer`): the table ``writers`` holds an epoch per
(writer id, partition). Opening a writer increments it in a write transaction and keeps the new
value; each of the writer's appends first reads the epoch inside its own write transaction (step 2)
and stores nothing if it changed. The check and the insert share the transaction and the topic's
lock, so no append of a superseded writer can land after its successor opened. Plain appends never
touch the table. Opening also notes the partition's end, so when it returns the watermark covers
every record stored before, and the successor's tail read misses none.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exactly.errors import InvalidLogURL, LogError, TopicExists, UnknownTopic
from exactly.log.base import (
    AppendResult,
    Log,
    LogRecord,
    PartitionWriter,
    Record,
    TopicInfo,
    accept_sequences,
    fenced,
    now_ms,
)
from exactly.log.group_commit import TopicWriter, Transaction, recover
from exactly.log.sqlite_format import (
    OFFSET_BITS,
    SUFFIX,
    WRITERS_TABLE,
    PackedBatch,
    committed_end,
    connect,
    create_tables,
    decode_columns,
    decode_records,
    has_rows_table,
    key_hash,
    pack,
    pack_columns,
    pack_records,
    partition_range,
)
from exactly.log.watermark import Watermark
from exactly.sqlite_wal import empty_wal, rebuild

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

# the batch holding rowid ?1 (the partition starts at ?3) and those after it, before rowid ?2
_BATCHES_FROM = (
    "SELECT id, data FROM batches WHERE id >= coalesce((SELECT max(id) FROM batches"
    " WHERE id <= ?1 AND id >= ?3), ?3) AND id < ?2 ORDER BY id"
)


class SqliteLog(Log):
    """The embedded log (see the module docstring for layout and commit protocol).

    Guarantees: an append is durable when it returns (committed and the WAL fsynced); readers
    (``read``, ``end_offsets``) see a record only once it is durable, as they stop at the synced
    watermark; offsets are dense per partition; any number of processes and threads may append and
    read the same topics at once (writers serialise on a file lock, readers never block writers).
    A write that fails may still be stored (an fsync error, then recovery): retry it with producer
    sequences, or let dedupe drop the copy. Assumes a local filesystem with working ``flock`` and
    ``fdatasync`` (not NFS), and a writable log directory for readers too (lock, watermark).
    """

    def __init__(self, directory: Path, **options: Any) -> None:
        super().__init__(**options)
        self.directory = directory
        self.url = f"sqlite://{directory}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise InvalidLogURL(f"cannot use {directory} as a log directory: {error}") from error
        if not directory.is_dir():
            raise InvalidLogURL(f"{directory} is not a directory; a sqlite log URL names one")
        self._lock = threading.Lock()
        self._reset()

    @classmethod
    def from_url(cls, rest: str, **options: Any) -> SqliteLog:
        if not rest or "?" in rest or "#" in rest:
            raise InvalidLogURL(
                f"sqlite log URL 'sqlite://{rest}' needs a directory: sqlite:///abs/dir or "
                "sqlite://relative/dir"
            )
        return cls(Path(rest), **options)

    def _reset(self) -> None:
        """Fresh per-process state; also after a fork, where threads and connections are gone."""
        self._pid = os.getpid()
        self._info: dict[str, TopicInfo] = {}
        self._writers: dict[str, TopicWriter] = {}
        self._readers = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._watermarks: dict[str, Watermark] = {}

    def _fork_check(self) -> None:
        if self._pid != os.getpid():
            self._reset()

    def _path(self, topic: str) -> Path:
        return self.directory / f"{topic}{SUFFIX}"

    def _lock_path(self, topic: str) -> Path:
        return self.directory / f"{topic}.lock"

    def _watermark(self, topic: str) -> Watermark:
        self._fork_check()
        with self._lock:
            watermark = self._watermarks.get(topic)
            if watermark is None:
                path = self.directory / f"{topic}.synced"
                try:
                    watermark = Watermark(path)
                except OSError as error:
                    raise LogError(f"cannot open the synced watermark {path}: {error}") from error
                self._watermarks[topic] = watermark
            return watermark

    def _writer(self, topic: str) -> TopicWriter:
        watermark = self._watermark(topic)
        with self._lock:
            writer = self._writers.get(topic)
            if writer is not None and writer.broken is None:
                return writer
            if writer is not None:  # its fsync failed: replace it by a reopened, verified one
                del self._writers[topic]
                writer.close()
            try:
                fresh = TopicWriter(
                    self._path(topic),
                    self._lock_path(topic),
                    watermark,
                    reopen=writer is not None,
                )
            except (OSError, sqlite3.Error) as error:
                raise LogError(
                    f"cannot open the log at {self._path(topic)} for writing: {error}. If an "
                    "fsync failed before, the disk may have lost data written since the last good "
                    "one: check it (dmesg, SMART) and the file (sqlite3 FILE 'PRAGMA "
                    "integrity_check'), then retry; nothing is acknowledged until this succeeds"
                ) from error
            self._writers[topic] = fresh
            return fresh

    def _durable_end(self, topic: str, partition: int) -> int:
        """The partition's synced watermark: readers never go past it (see log/watermark.py)."""
        partitions = self._topic_info(topic).partitions
        watermark = self._watermark(topic)
        end = watermark.get(partitions, partition)
        if end is None:
            self._recover(topic)
            end = watermark.get(partitions, partition)
        if end is None:
            raise LogError(self._unreadable(watermark))
        return end

    def _durable_ends(self, topic: str) -> list[int]:
        partitions = self._topic_info(topic).partitions
        watermark = self._watermark(topic)
        ends = watermark.get_all(partitions)
        if ends is None:
            self._recover(topic)
            ends = watermark.get_all(partitions)
        if ends is None:
            raise LogError(self._unreadable(watermark))
        return ends

    def _recover(self, topic: str) -> None:
        """Rebuild a missing or invalid watermark file from the committed ends, after an fsync."""
        watermark = self._watermark(topic)
        try:
            lock_fd = os.open(self._lock_path(topic), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                recover(self._path(topic), lock_fd, self._reader(topic), watermark)
            finally:
                os.close(lock_fd)
        except (OSError, sqlite3.Error) as error:
            raise LogError(f"{self._unreadable(watermark)}: {error}") from error

    @staticmethod
    def _unreadable(watermark: Watermark) -> str:
        return (
            f"cannot rebuild the synced watermark {watermark.path}; readers need the log "
            "directory to be writable (its lock and watermark files)"
        )

    def _reader(self, topic: str) -> sqlite3.Connection:
        self._fork_check()
        conns: dict[str, sqlite3.Connection] | None = getattr(self._readers, "conns", None)
        if conns is None:
            conns = self._readers.conns = {}
        conn = conns.get(topic)
        if conn is None:
            conn = connect(self._path(topic), readonly=True)
            conns[topic] = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    # -- topics ---------------------------------------------------------------------------------

    def _create_topic(self, topic: str, partitions: int, *, exist_ok: bool) -> TopicInfo:
        watermark = self._watermark(topic)

        def create(transaction: Transaction) -> tuple[int, bool]:
            conn = transaction.conn
            create_tables(conn)
            row = conn.execute("SELECT partitions FROM topic").fetchone()
            if row is not None:
                return int(row[0]), False
            conn.execute("INSERT INTO topic VALUES (?, ?)", (topic, partitions))
            watermark.reset(partitions)  # under the topic's lock: a stale file must not show
            return partitions, True

        existing, created = self._writer(topic).submit(create).result()
        if created:
            # the new file's directory entry must survive a power cut too
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        elif existing != partitions or not exist_ok:
            raise TopicExists(
                f"topic {topic!r} already exists with {existing} partitions"
                + ("" if existing == partitions else f", not {partitions}")
            )
        info = TopicInfo(topic, existing)
        self._info[topic] = info
        return info

    def _topic_info(self, topic: str) -> TopicInfo:
        self._fork_check()
        info = self._info.get(topic)
        if info is not None:
            return info
        if not self._path(topic).exists():
            raise UnknownTopic(self._unknown(topic))
        try:
            row = self._reader(topic).execute("SELECT name, partitions FROM topic").fetchone()
        except sqlite3.OperationalError as error:
            if "no such table" not in str(error):  # not "its creation never committed"
                raise LogError(
                    f"cannot read topic {topic!r} at {self._path(topic)}: {error}; SQLite needs "
                    "to write beside the file even to read it, so check that the directory is "
                    "writable (the data dir: --data-dir, EXACTLY_DATA_DIR)"
                ) from None
            row = None
        if row is None:
            raise UnknownTopic(self._unknown(topic))
        if has_rows_table(self._reader(topic)):
            self._writer(topic)  # written by an earlier version: opening a writer converts it
        info = self._info[topic] = TopicInfo(row[0], int(row[1]))
        return info

    def _unknown(self, topic: str) -> str:
        return (
            f"topic {topic!r} does not exist in {self.url}; "
            f"create it with: exactly log create {topic} --partitions N"
        )

    def _topics(self) -> list[str]:
        names = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            topic = path.name[: -len(SUFFIX)]
            with contextlib.suppress(UnknownTopic):
                self._topic_info(topic)
                names.append(topic)
        return names

    # -- records --------------------------------------------------------------------------------

    def _append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record],
        producer: str | None,
        sequences: Sequence[int] | None,
    ) -> AppendResult:
        if producer is None or sequences is None:
            packed = pack(records, now_ms())  # before queueing for the lock

            def append(transaction: Transaction) -> AppendResult:
                return transaction.add_packed(partition, packed)

        else:

            def append(transaction: Transaction) -> AppendResult:
                # which records are stored is known only under the lock: packed there
                keep = self._check_sequences(transaction.conn, partition, producer, sequences)
                return transaction.add(partition, records, keep, now_ms())

        result: AppendResult = self._writer(topic).submit(append).result()
        return result

    def append_columns(self, topic: str, partition: int, columns: pa.RecordBatch) -> AppendResult:
        """Packed in Arrow's kernels (``sqlite_format.pack_columns``), checked as
        :meth:`append` checks records."""
        from exactly.log.columns import check

        self._check_partition(topic, partition)
        check(columns, self.max_record_bytes)
        if not columns.num_rows:
            return AppendResult([])
        packed = pack_columns(columns, now_ms())  # before queueing for the lock

        def append(transaction: Transaction) -> AppendResult:
            return transaction.add_packed(partition, packed)

        result: AppendResult = self._writer(topic).submit(append).result()
        return result

    def _append_many(self, topic: str, batches: dict[int, list[Record]]) -> dict[int, AppendResult]:
        stamp = now_ms()
        packed = {p: pack(records, stamp) for p, records in batches.items()}

        def append(transaction: Transaction) -> dict[int, AppendResult]:
            return {p: transaction.add_packed(p, found) for p, found in packed.items()}

        results: dict[int, AppendResult] = self._writer(topic).submit(append).result()
        return results

    @staticmethod
    def _check_sequences(
        conn: sqlite3.Connection, partition: int, producer: str, sequences: Sequence[int]
    ) -> list[bool]:
        """Which records pass the producer-sequence check; stores the new last sequence."""
        row = conn.execute(
            "SELECT last_sequence FROM producers WHERE producer = ? AND partition = ?",
            (producer, partition),
        ).fetchone()
        keep, last = accept_sequences(None if row is None else row[0], sequences)
        if last is not None:
            conn.execute(
                "INSERT INTO producers VALUES (?, ?, ?) ON CONFLICT (producer, partition)"
                " DO UPDATE SET last_sequence = excluded.last_sequence",
                (producer, partition, last),
            )
        return keep

    @contextlib.contextmanager
    def _stored_from(
        self, topic: str, partition: int, offset: int, max_records: int
    ) -> Iterator[tuple[int, Iterator[tuple[int, bytes]]]]:
        """The stored batches a read from ``offset`` of at most ``max_records`` records steps
        through, one at a time (a read of a few records decodes one batch), never past what is
        synced: the offset the read stops before, and each batch's first offset and blob. The
        read transaction ends on leaving, not when the cursor is collected."""
        stop = min(self._durable_end(topic, partition), offset + max_records)
        if offset >= stop:
            yield offset, iter(())
            return
        low = partition_range(partition)[0]
        cursor = self._reader(topic).execute(_BATCHES_FROM, (low + offset, low + stop, low))
        try:
            yield stop, ((first - low, data) for first, data in cursor)
        finally:
            cursor.close()

    def _read(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool = True,
    ) -> list[LogRecord]:
        found: list[LogRecord] = []
        at, size = offset, 0
        with self._stored_from(topic, partition, offset, max_records) as (stop, stored):
            for first, data in stored:
                taken, content = decode_records(data, partition, at, at - first, stop - at, headers)
                if size + content >= max_bytes:  # this batch reaches max_bytes: cut after it
                    for count, record in enumerate(taken, 1):
                        size += len(record.value) + len(record.key or b"")
                        if size >= max_bytes:
                            return found + taken[:count]
                found += taken
                at += len(taken)
                size += content
                if at >= stop:
                    break
        return found

    def _read_columns_at(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int,
        max_bytes: int,
        headers: bool,
        *,
        retry: bool = False,
    ) -> tuple[pa.RecordBatch | None, int]:
        """:meth:`_read` as columns, cut from each stored batch by ``decode_columns``."""
        import numpy as np
        import pyarrow as pa

        found: list[pa.RecordBatch] = []
        at, size = offset, 0
        with self._stored_from(topic, partition, offset, max_records) as (stop, stored):
            for first, data in stored:
                taken, contents = decode_columns(data, at, at - first, stop - at, headers)
                sizes = np.cumsum(contents) + size
                if len(sizes) and sizes[-1] >= max_bytes:  # cut after the record reaching it
                    found.append(taken.slice(0, int(np.searchsorted(sizes, max_bytes)) + 1))
                    break
                found.append(taken)
                at += taken.num_rows
                size = int(sizes[-1]) if len(sizes) else size
                if at >= stop:
                    break
        rows = sum(batch.num_rows for batch in found)
        if not rows:
            return None, offset
        return pa.concat_batches(found) if len(found) > 1 else found[0], offset + rows

    def _find(self, topic: str, partition: int, key: bytes) -> list[LogRecord] | None:
        """The records of ``key``: the partition's key hashes scanned (numpy), then the batches
        that hold a match decoded; never past the synced watermark."""
        import numpy as np

        low = partition_range(partition)[0]
        end = self._durable_end(topic, partition)
        if end == 0:
            return []
        conn = self._reader(topic)
        rows = conn.execute(
            "SELECT id, hashes FROM batch_keys WHERE id >= ? AND id < ? ORDER BY id",
            (low, low + end),
        ).fetchall()
        if not rows:
            return []
        firsts = np.fromiter((row[0] for row in rows), np.int64, len(rows))
        counts = np.fromiter((len(row[1]) // 4 for row in rows), np.int64, len(rows))
        hashes = np.frombuffer(b"".join(row[1] for row in rows), "<u4")
        matching = np.unique(np.repeat(firsts, counts)[hashes == key_hash(key)]).tolist()
        found = []
        for first in matching:
            (data,) = conn.execute("SELECT data FROM batches WHERE id = ?", (first,)).fetchone()
            records, _ = decode_records(data, partition, first - low, 0, len(data), headers=True)
            found += [r for r in records if r.key == key and r.offset < end]
        return found

    def rewrite(
        self,
        topic: str,
        change: Callable[[LogRecord], bytes | None],
        hint: Callable[[bytes], bool] | None = None,
    ) -> int:
        """In place, batch by batch (the batches ``hint`` picks, found before the write lock is
        taken, then read again under it); ``secure_delete`` zeroes the old bytes in the file, a
        ``VACUUM`` removes the copies b-tree balances left (:func:`rebuild`) and a TRUNCATE
        checkpoint empties the WAL of their page images (:func:`empty_wal`)."""
        self.topic_info(topic)
        picked = [
            rowid
            for rowid, data in self._reader(topic).execute("SELECT id, data FROM batches")
            if hint is None or hint(data)
        ]

        def apply(transaction: Transaction) -> int:
            conn = transaction.conn
            conn.execute("PRAGMA secure_delete = ON")
            changed = 0
            for rowid in picked:
                found = conn.execute("SELECT data FROM batches WHERE id = ?", (rowid,)).fetchone()
                if found is None:
                    continue
                partition = rowid >> OFFSET_BITS
                first = rowid - partition_range(partition)[0]
                records, _ = decode_records(found[0], partition, first, 0, 1 << 62, True)
                kept: list[Record] = []
                for record in records:
                    value = change(record)
                    changed += value is not None
                    kept.append(
                        Record(
                            record.value if value is None else value,
                            record.key,
                            record.headers,
                            record.timestamp,
                        )
                    )
                data, _ = pack_records(kept, now_ms())
                if data != found[0]:
                    conn.execute("UPDATE batches SET data = ? WHERE id = ?", (data, rowid))
            return changed

        # with nothing picked, still rebuild and empty the WAL: an earlier rewrite may have
        # been killed between its commit and this
        changed: int = self._writer(topic).submit(apply).result() if picked else 0
        rebuild(self._path(topic))  # the copies b-tree balances left in freed space
        if not empty_wal(self._path(topic)):
            raise LogError(
                f"could not empty the write-ahead log of {self._path(topic)} (readers held it "
                "for 30 s): its old pages stay until the forget is run again"
            )
        return changed

    def _settle(self, topic: str) -> None:
        """Step 0 of group_commit.py, as a writer's start runs it: under the write lock, sync
        what is committed and raise the watermark to it."""
        self._recover(topic)

    def _end_offsets(self, topic: str) -> dict[int, int]:
        durable = self._durable_ends(topic)
        return {p: min(end, self._committed_end(topic, p)) for p, end in enumerate(durable)}

    def _end_offset(self, topic: str, partition: int) -> int:
        """The synced watermark (never above the committed end, whatever the file says)."""
        return min(self._durable_end(topic, partition), self._committed_end(topic, partition))

    def _committed_end(self, topic: str, partition: int) -> int:
        return committed_end(self._reader(topic), partition) - partition_range(partition)[0]

    def _open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter:
        def bump(transaction: Transaction) -> int:
            transaction.conn.execute(WRITERS_TABLE)  # topics created before fenced writers existed
            (epoch,) = transaction.conn.execute(
                "INSERT INTO writers VALUES (?, ?, 1) ON CONFLICT (writer, partition)"
                " DO UPDATE SET epoch = epoch + 1 RETURNING epoch",
                (writer_id, partition),
            ).fetchone()
            transaction.end(partition)  # the successor's tail read must see all that is stored
            return int(epoch)

        epoch: int = self._writer(topic).submit(bump).result()
        return SqliteWriter(self, topic, partition, writer_id, epoch)

    # -- consumer groups and producers ----------------------------------------------------------

    def _commit_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        def commit(transaction: Transaction) -> None:
            transaction.conn.executemany(
                "INSERT INTO group_offsets VALUES (?, ?, ?) ON CONFLICT (grp, partition)"
                " DO UPDATE SET next_offset = excluded.next_offset",
                [(group, partition, offset) for partition, offset in offsets.items()],
            )

        self._writer(topic).submit(commit).result()

    def _committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        rows = self._reader(topic).execute(
            "SELECT partition, next_offset FROM group_offsets WHERE grp = ?", (group,)
        )
        return {int(partition): int(offset) for partition, offset in rows}

    def _last_sequence(self, topic: str, partition: int, producer: str) -> int | None:
        """Read by the committer and answered after the next fsync, like a write: a producer
        resumes after this sequence, so it must not be one that a power cut could take back."""

        def last(transaction: Transaction) -> int | None:
            row = transaction.conn.execute(
                "SELECT last_sequence FROM producers WHERE producer = ? AND partition = ?",
                (producer, partition),
            ).fetchone()
            return None if row is None else int(row[0])

        sequence: int | None = self._writer(topic).submit(last).result()
        return sequence

    def close(self) -> None:
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            writers, self._writers = self._writers, {}
            readers, self._reader_conns = self._reader_conns, []
            watermarks, self._watermarks = self._watermarks, {}
        for writer in writers.values():
            writer.close()
        for conn in readers:
            conn.close()
        for watermark in watermarks.values():
            watermark.close()


class SqliteWriter(PartitionWriter):
    """A fenced writer of one partition: each append checks the epoch in its own transaction.

    Each append is durable (and visible) when it returns, so :meth:`commit` has nothing to add.
    """

    whole_appends = True  # an append is one transaction

    def __init__(self, log: SqliteLog, topic: str, partition: int, writer_id: str, epoch: int):
        self._log = log
        self.topic, self.partition, self.writer_id = topic, partition, writer_id
        self.epoch = epoch

    def append(self, records: Sequence[Record]) -> None:
        self._log._check_records(records)
        if records:
            self._append_packed(pack(records, now_ms()))  # packed before queueing for the lock

    def append_columns(self, columns: pa.RecordBatch) -> None:
        from exactly.log.columns import check

        check(columns, self._log.max_record_bytes)
        if columns.num_rows:
            self._append_packed(pack_columns(columns, now_ms()))

    def _append_packed(self, packed: list[PackedBatch]) -> None:
        def append(transaction: Transaction) -> AppendResult | None:
            row = transaction.conn.execute(
                "SELECT epoch FROM writers WHERE writer = ? AND partition = ?",
                (self.writer_id, self.partition),
            ).fetchone()
            if row is None or row[0] != self.epoch:
                return None  # superseded; never raise here: other appends share the transaction
            return transaction.add_packed(self.partition, packed)

        if self._log._writer(self.topic).submit(append).result() is None:
            raise fenced(self.topic, self.partition, self.writer_id)

    def commit(self) -> None:
        """Nothing to do: every append was durable when it returned."""

    def close(self) -> None:
        """Nothing to release: the log owns the connection."""
