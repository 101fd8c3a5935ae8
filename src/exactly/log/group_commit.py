"""The sqlite log's group commit: one committer and one syncer thread per topic and process.

The commit protocol of one write transaction (several appends grouped together):

1. take the topic's write lock (``flock`` on ``DIR/<topic>.lock``), so writers from other
   processes queue in the kernel rather than in SQLite's sleeping busy handler;
2. ``BEGIN IMMEDIATE``; per grouped append: next offset, producer-sequence check, insert; ``COMMIT``
   (WAL mode, ``synchronous=NORMAL``: the commit writes the WAL, it does not fsync it), noting the
   end offset each touched partition reached;
3. release the lock;
4. ``fdatasync`` the WAL, outside the lock, so fsyncs of several processes overlap and the kernel
   merges them;
5. raise the synced watermark (``DIR/<topic>.synced``, :mod:`exactly.log.watermark`) to the ends
   of step 2: readers stop there, so no reader sees a record before it is durable;
6. only then tell the appenders their offsets.

Step 0, once per process and topic, before its first write: under the lock, fdatasync the WAL
and raise the watermark to every partition's committed end (:func:`recover`), so the records of
a writer killed between steps 3 and 4 become visible once a writer opens. They were never
acknowledged; a producer resuming from ``SqliteLog.last_sequence`` (read like a write, after
step 4) sees them and does not repeat them. One fdatasync makes durable every commit written
before it, other processes' too, so a watermark raised to my ends covers theirs below mine.

If an fdatasync fails (EIO), the kernel may have dropped the pages it could not write and marked
them clean, so no later fsync on that connection proves anything: the writer fails the write in
flight and every one queued, commits nothing more, and the next write opens a fresh one, which
drops the cached pages (``POSIX_FADV_DONTNEED``), reconnects and runs step 0 (reads back each
partition's end, fsyncs) before acknowledging anything, or fails with a :class:`LogError` saying
what to check. SQLite's own checkpoints keep the rule: a checkpoint fsyncs the WAL before copying
pages into the database and the database before the WAL is reused. So this module never opens
the database file beside SQLite: closing any descriptor of it would drop every POSIX lock the
process's connections hold, and another process could then checkpoint and delete the WAL that a
writer here is still appending to.

Within a process, appends from concurrent threads wait in a queue while the previous transaction
commits and syncs, and are then committed together: that is the group commit.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from exactly.errors import LogError
from exactly.log.base import AppendResult, Record
from exactly.log.sqlite_format import (
    PackedBatch,
    committed_end,
    connect,
    convert_rows,
    decode_records,
    has_rows_table,
    insert_batches,
    pack,
    partition_range,
    partitions_of,
    placed,
)
from exactly.log.watermark import Watermark

MAX_GROUP = 256  # appends merged into one transaction at most


class Transaction:
    """What the grouped writes of one transaction share: next offsets and the batches to insert."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.batches: list[tuple[int, PackedBatch]] = []  # rowid of the first record, batch
        self._next: dict[int, int] = {}

    def add(
        self, partition: int, records: Sequence[Record], keep: list[bool] | None, stamp: int
    ) -> AppendResult:
        """Queue ``records`` (those ``keep`` marks, if given) for insertion; return offsets."""
        chosen = records if keep is None else [r for r, k in zip(records, keep, strict=True) if k]
        result = self.add_packed(partition, pack(chosen, stamp))
        if keep is None:
            return result
        offsets: list[int | None] = []
        taken = iter(result.offsets)
        for fresh in keep:
            offsets.append(next(taken) if fresh else None)
        return AppendResult(offsets)

    def add_packed(self, partition: int, batches: Sequence[PackedBatch]) -> AppendResult:
        """Queue batches packed beforehand (:func:`~exactly.log.sqlite_format.pack`)."""
        count = sum(batch.count for batch in batches)
        first = self._take(partition, count)
        self.batches += placed(first, batches)
        start = first - partition_range(partition)[0]
        return AppendResult(list(range(start, start + count)))

    def _take(self, partition: int, count: int) -> int:
        """Reserve ``count`` offsets in ``partition``; returns the rowid of the first."""
        first = self._next.get(partition)
        if first is None:
            first = committed_end(self.conn, partition)
        if first + count > partition_range(partition)[1]:
            raise LogError(f"partition {partition} is full")
        self._next[partition] = first + count
        return first

    def end(self, partition: int) -> int:
        """The partition's end offset as this transaction sees it (recorded for the watermark)."""
        return self._take(partition, 0) - partition_range(partition)[0]

    def ends(self) -> dict[int, int]:
        """The end offset of every partition this transaction read or wrote, after its inserts."""
        return {p: first - partition_range(p)[0] for p, first in self._next.items()}

    def insert(self) -> None:
        if self.batches:
            insert_batches(self.conn, self.batches)


@dataclass
class _Job:
    """One write waiting for the committer: ``apply`` runs inside the shared transaction."""

    apply: Callable[[Transaction], Any]
    future: Future[Any]
    result: Any = None


@dataclass
class _Group:
    """One committed transaction waiting for the syncer: its jobs and the ends it reached."""

    jobs: list[_Job | None]
    ends: dict[int, int]


class TopicWriter:
    """The committer and the syncer of one topic in this process.

    The committer groups queued writes into one transaction (steps 1-3 of the module docstring);
    the syncer fsyncs, raises the watermark and answers (steps 4-6), so the next group is written
    while the previous one is being synced, and one fsync covers every group committed before it.

    A failed fdatasync breaks the writer for good (``broken``): the kernel may have dropped the
    pages it could not write and marked them clean, so a later fsync that succeeds would prove
    nothing about them. Every write in flight or queued fails, nothing is committed on this
    connection again, and ``SqliteLog`` replaces the writer by a new one that drops the cached
    pages, reopens, verifies and fsyncs (:func:`recover`) before it acknowledges anything.
    """

    def __init__(
        self, path: Path, lock_path: Path, watermark: Watermark, *, reopen: bool = False
    ) -> None:
        self.path = path
        self.watermark = watermark
        self.broken: LogError | None = None
        self._lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._conn: sqlite3.Connection | None = None
        try:
            if reopen:
                drop_cached(path)
            self._conn = connect(path, readonly=False)
            # 0. what earlier writers committed, a killed one's too, is durable and visible
            self.partitions = recover(path, self._lock_fd, self._conn, watermark)
        except BaseException:
            if self._conn is not None:
                self._conn.close()
            os.close(self._lock_fd)
            raise
        self._wal_fd: int | None = None
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._committed: queue.SimpleQueue[_Group | None] = queue.SimpleQueue()
        name = path.stem
        self._committer = threading.Thread(target=self._commit_loop, name=f"log-commit-{name}")
        self._syncer = threading.Thread(target=self._sync_loop, name=f"log-sync-{name}")
        self._committer.daemon = self._syncer.daemon = True
        self._committer.start()
        self._syncer.start()

    def submit(self, apply: Callable[[Transaction], Any]) -> Future[Any]:
        job = _Job(apply, Future())
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        self._queue.put(None)
        self._committer.join()
        self._syncer.join()
        if self._conn is not None:
            self._conn.close()
        os.close(self._lock_fd)
        if self._wal_fd is not None:
            os.close(self._wal_fd)

    def _commit_loop(self) -> None:
        while (jobs := _drain(self._queue, MAX_GROUP)) is not None:
            if self.broken is not None:
                _fail(jobs, self.broken)  # never again on a connection whose fsync failed
            else:
                try:
                    ends = self._commit(jobs)
                except Exception as error:  # noqa: BLE001 - every grouped appender must hear of it
                    _fail(jobs, LogError(f"the log at {self.path} could not commit: {error}"))
                else:
                    self._committed.put(_Group(jobs, ends))
            if jobs[-1] is None:
                break
        self._committed.put(None)

    def _commit(self, jobs: list[_Job | None]) -> dict[int, int]:
        assert self._conn is not None
        # 1. the topic's write lock, shared with every process
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            # 2. one transaction for every grouped write
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                transaction = Transaction(self._conn)
                for job in jobs:
                    if job is not None:
                        job.result = job.apply(transaction)
                transaction.insert()
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            if self.partitions is None:  # this writer created the topic
                self.partitions = partitions_of(self._conn)
            return transaction.ends()
        finally:
            # 3. release the lock before syncing
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _sync_loop(self) -> None:
        while (groups := _drain(self._committed, 1 << 30)) is not None:
            done = [job for group in groups if group is not None for job in group.jobs if job]
            if self.broken is None:
                try:
                    # 4. durable: one fsync of the WAL, outside the lock, for every group so far
                    self._sync()
                except OSError as failed:
                    self.broken = LogError(
                        f"the log at {self.path} could not fsync ({failed}): this write and those "
                        "queued behind it were not acknowledged and may be lost; the next write "
                        "reopens and verifies the log (if the disk is failing, see dmesg)"
                    )
            problem = self.broken
            if problem is None:
                try:
                    # 5. visible: readers stop at the watermark, raised to what was just synced
                    self._publish([group for group in groups if group is not None])
                except OSError as failed:
                    problem = LogError(f"could not raise {self.watermark.path}: {failed}")
            if problem is not None:
                _fail(done, problem)
            else:
                # 6. only now do the appenders learn their offsets
                for job in done:
                    job.future.set_result(job.result)
            if groups[-1] is None:
                return

    def _sync(self) -> None:
        if self._wal_fd is None:
            # The WAL exists once the first transaction committed; it is never unlinked while this
            # connection is open, so the descriptor stays valid for the writer's life.
            self._wal_fd = os.open(f"{self.path}-wal", os.O_RDONLY)
        os.fdatasync(self._wal_fd)

    def _publish(self, groups: list[_Group]) -> None:
        """Raise the watermark to the ends the synced groups reached (and so everything before)."""
        ends: dict[int, int] = {}
        for group in groups:
            for partition, end in group.ends.items():
                ends[partition] = max(end, ends.get(partition, 0))
        if ends and self.partitions is not None:
            self.watermark.raise_to(self.partitions, ends)


def recover(path: Path, lock_fd: int, conn: sqlite3.Connection, watermark: Watermark) -> int | None:
    """Make every committed record durable and visible; the partition count (None: no topic yet).

    Runs when a process starts writing a topic, and when a reader finds the watermark missing or
    invalid. Under the topic's write lock, so nothing commits meanwhile: read each partition's
    committed end and its last record (a cheap check that the file reads back), fdatasync the WAL
    and the database, raise the watermark to those ends. So the records of a writer killed between
    its commit and its fsync become visible here: never acknowledged, but durable from now on.
    """
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        partitions = partitions_of(conn)
        if partitions is None:
            return None
        if has_rows_table(conn):  # written by an earlier version: one row per record
            convert_rows(conn, partitions)
        ends: dict[int, int] = {}
        for partition in range(partitions):
            low = partition_range(partition)[0]
            end = committed_end(conn, partition)
            if end > low:  # a cheap check that the file reads back: the last batch decodes
                (data,) = conn.execute(
                    "SELECT data FROM batches WHERE id < ? ORDER BY id DESC LIMIT 1", (end,)
                ).fetchone()
                decode_records(data, partition, 0, 0, len(data), headers=True)
            ends[partition] = end - low
        # The WAL only: what left it for the database was synced by SQLite's checkpoint (WAL
        # before copying, database after), and the database file must not be opened here at all.
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(f"{path}-wal", os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        watermark.raise_to(partitions, ends, complete=True)
        return partitions
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)


_DATABASE_FDS: dict[str, int] = {}


def drop_cached(path: Path) -> None:
    """Evict the topic's cached pages, so a reopened writer reads what the disk holds.

    Closing any descriptor of a database file drops every POSIX lock this process's SQLite
    connections hold on it (so another process may checkpoint and delete the WAL under them):
    the database's descriptor is opened once and kept for the process's life. The WAL carries no
    SQLite locks; its descriptor is closed at once.
    """
    fd = _DATABASE_FDS.get(str(path))
    if fd is None:
        fd = _DATABASE_FDS[str(path)] = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    with contextlib.suppress(FileNotFoundError):
        wal = os.open(f"{path}-wal", os.O_RDONLY)
        try:
            os.posix_fadvise(wal, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(wal)


T = TypeVar("T")


def _drain(source: queue.SimpleQueue[T | None], most: int) -> list[T | None] | None:
    """Block for one item, then take what else is queued (up to ``most``).

    Returns None on a stop marker with nothing before it; a list ending in None when the stop
    marker came after some items.
    """
    first = source.get()
    if first is None:
        return None
    items: list[T | None] = [first]
    while len(items) < most:
        try:
            item = source.get_nowait()
        except queue.Empty:
            break
        items.append(item)
        if item is None:
            break
    return items


def _fail(jobs: Sequence[_Job | None], error: LogError) -> None:
    for job in jobs:
        if job is not None:
            job.future.set_exception(error)
