"""The embedded log: one SQLite database per topic under a directory.

Layout: ``DIR/<topic>.sqlite`` holds the topic's partition count, its records, the last sequence of
each producer per partition and the consumer-group offsets. A record's rowid is
``partition << 40 | offset``, so a partition is a contiguous rowid range: reads are range scans of
the table itself and the next offset is one b-tree seek, with no secondary index to maintain.
One file per topic (not per partition) because an append that spans partitions, such as a
collector request, then commits with one fsync; ``bench/log_layout.py`` measures the choice.
Beside it, ``DIR/<topic>.lock`` (the write lock) and ``DIR/<topic>.synced`` (the synced watermark).

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
acknowledged; a producer resuming from :meth:`SqliteLog.last_sequence` (read like a write, after
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
import fcntl
import os
import queue
import sqlite3
import struct
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import Any, TypeVar

from exactly.errors import InvalidLogURL, LogError, TopicExists, UnknownTopic
from exactly.log.base import (
    AppendResult,
    Header,
    Log,
    LogRecord,
    PartitionWriter,
    Record,
    TopicInfo,
    accept_sequences,
    fenced,
    now_ms,
)
from exactly.log.watermark import Watermark

OFFSET_BITS = 40
MAX_GROUP = 256  # appends merged into one transaction at most
SUFFIX = ".sqlite"

_WRITERS = """CREATE TABLE IF NOT EXISTS writers (
    writer TEXT NOT NULL, partition INTEGER NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (writer, partition)) WITHOUT ROWID"""

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS topic (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY, timestamp INTEGER NOT NULL, key BLOB, value BLOB NOT NULL,
    headers BLOB);
CREATE TABLE IF NOT EXISTS producers (
    producer TEXT NOT NULL, partition INTEGER NOT NULL, last_sequence INTEGER NOT NULL,
    PRIMARY KEY (producer, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets (
    grp TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (grp, partition)) WITHOUT ROWID;
"""
    + _WRITERS
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


def _fitting(rows: list[Any], max_bytes: int) -> int:
    """How many of ``(key, value, ...)`` rows a batch of ``max_bytes`` takes (at least one)."""
    keys, values = map(itemgetter(0), rows), map(itemgetter(1), rows)
    if sum(map(len, values)) + sum(map(len, filter(None, keys))) < max_bytes:
        return len(rows)
    sizes = accumulate(len(key or b"") + len(value) for key, value, *_ in rows)
    return next((n + 1 for n, size in enumerate(sizes) if size >= max_bytes), len(rows))


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA busy_timeout = 60000")
    if readonly:
        conn.execute("PRAGMA query_only = ON")
    else:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
    return conn


class Transaction:
    """What the grouped writes of one transaction share: next offsets and the rows to insert."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.rows: list[tuple[int, int, bytes | None, bytes, bytes | None]] = []
        self._next: dict[int, int] = {}

    def add(
        self, partition: int, records: Sequence[Record], keep: list[bool] | None, stamp: int
    ) -> AppendResult:
        """Queue ``records`` (those ``keep`` marks, if given) for insertion; return offsets."""
        chosen = records if keep is None else [r for r, k in zip(records, keep, strict=True) if k]
        first = self._take(partition, len(chosen))
        self.rows += [
            (
                first + index,
                stamp if r.timestamp is None else r.timestamp,
                r.key,
                r.value,
                encode_headers(r.headers) if r.headers else None,
            )
            for index, r in enumerate(chosen)
        ]
        start = first - partition_range(partition)[0]
        if keep is None:
            return AppendResult(list(range(start, start + len(chosen))))
        offsets: list[int | None] = []
        for fresh in keep:
            offsets.append(start if fresh else None)
            start += fresh
        return AppendResult(offsets)

    def _take(self, partition: int, count: int) -> int:
        """Reserve ``count`` offsets in ``partition``; returns the rowid of the first."""
        low, high = partition_range(partition)
        first = self._next.get(partition)
        if first is None:
            (top,) = self.conn.execute(
                "SELECT max(id) FROM records WHERE id >= ? AND id < ?", (low, high)
            ).fetchone()
            first = low if top is None else top + 1
        if first + count > high:
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
        if self.rows:
            self.conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?)", self.rows)


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


class _TopicWriter:
    """The committer and the syncer of one topic in this process.

    The committer groups queued writes into one transaction (steps 1-3 of the module docstring);
    the syncer fsyncs, raises the watermark and answers (steps 4-6), so the next group is written
    while the previous one is being synced, and one fsync covers every group committed before it.

    A failed fdatasync breaks the writer for good (``broken``): the kernel may have dropped the
    pages it could not write and marked them clean, so a later fsync that succeeds would prove
    nothing about them. Every write in flight or queued fails, nothing is committed on this
    connection again, and :class:`SqliteLog` replaces the writer by a new one that drops the cached
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
                _drop_cached(path)
            self._conn = _connect(path, readonly=False)
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
                self.partitions = _partitions(self._conn)
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
        partitions = _partitions(conn)
        if partitions is None:
            return None
        ends: dict[int, int] = {}
        for partition in range(partitions):
            low, high = partition_range(partition)
            (top,) = conn.execute(
                "SELECT max(id) FROM records WHERE id >= ? AND id < ?", (low, high)
            ).fetchone()
            if top is not None:
                conn.execute("SELECT value FROM records WHERE id = ?", (top,)).fetchone()
            ends[partition] = 0 if top is None else int(top) - low + 1
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


def _partitions(conn: sqlite3.Connection) -> int | None:
    """The topic's partition count; None while the topic is not created."""
    try:
        row = conn.execute("SELECT partitions FROM topic").fetchone()
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        return None
    return None if row is None else int(row[0])


_DATABASE_FDS: dict[str, int] = {}


def _drop_cached(path: Path) -> None:
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
        self._writers: dict[str, _TopicWriter] = {}
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

    def _writer(self, topic: str) -> _TopicWriter:
        watermark = self._watermark(topic)
        with self._lock:
            writer = self._writers.get(topic)
            if writer is not None and writer.broken is None:
                return writer
            if writer is not None:  # its fsync failed: replace it by a reopened, verified one
                del self._writers[topic]
                writer.close()
            try:
                fresh = _TopicWriter(
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
        partitions = self._describe(topic).partitions
        watermark = self._watermark(topic)
        end = watermark.get(partitions, partition)
        if end is None:
            self._recover(topic)
            end = watermark.get(partitions, partition)
        if end is None:
            raise LogError(self._unreadable(watermark))
        return end

    def _durable_ends(self, topic: str) -> list[int]:
        partitions = self._describe(topic).partitions
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
            conn = _connect(self._path(topic), readonly=True)
            conns[topic] = conn
            with self._lock:
                self._reader_conns.append(conn)
        return conn

    # -- topics ---------------------------------------------------------------------------------

    def _create_topic(self, topic: str, partitions: int, *, exist_ok: bool) -> TopicInfo:
        watermark = self._watermark(topic)

        def create(transaction: Transaction) -> tuple[int, bool]:
            conn = transaction.conn
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
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

    def _describe(self, topic: str) -> TopicInfo:
        self._fork_check()
        info = self._info.get(topic)
        if info is not None:
            return info
        if not self._path(topic).exists():
            raise UnknownTopic(self._unknown(topic))
        try:
            row = self._reader(topic).execute("SELECT name, partitions FROM topic").fetchone()
        except sqlite3.OperationalError:  # the file exists but its creation never committed
            row = None
        if row is None:
            raise UnknownTopic(self._unknown(topic))
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
                self._describe(topic)
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
        def append(transaction: Transaction) -> AppendResult:
            keep: list[bool] | None = None
            if producer is not None and sequences is not None:
                keep = self._check_sequences(transaction.conn, partition, producer, sequences)
            return transaction.add(partition, records, keep, now_ms())

        result: AppendResult = self._writer(topic).submit(append).result()
        return result

    def _append_many(self, topic: str, batches: dict[int, list[Record]]) -> dict[int, AppendResult]:
        def append(transaction: Transaction) -> dict[int, AppendResult]:
            stamp = now_ms()
            return {p: transaction.add(p, records, None, stamp) for p, records in batches.items()}

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

    def _read(
        self, topic: str, partition: int, offset: int, max_records: int, max_bytes: int
    ) -> list[LogRecord]:
        end = self._durable_end(topic, partition)  # never past what is synced
        if offset >= end:
            return []
        low = partition_range(partition)[0]
        rows = (
            self._reader(topic)
            .execute(
                "SELECT key, value, headers, timestamp FROM records"
                " WHERE id >= ? AND id < ? ORDER BY id LIMIT ?",
                (low + offset, low + end, max_records),
            )
            .fetchall()
        )
        rows = rows[: _fitting(rows, max_bytes)]
        new = tuple.__new__  # skips LogRecord's Python-level __new__: reads build many records
        # offsets are dense, so the n-th row is at offset + n
        return [
            new(LogRecord, (partition, at, key, value, decode_headers(h) if h else (), ts))
            for at, (key, value, h, ts) in enumerate(rows, offset)
        ]

    def _end_offsets(self, topic: str) -> dict[int, int]:
        durable = self._durable_ends(topic)
        return {p: min(end, self._committed_end(topic, p)) for p, end in enumerate(durable)}

    def _end_offset(self, topic: str, partition: int) -> int:
        """The synced watermark (never above the committed end, whatever the file says)."""
        return min(self._durable_end(topic, partition), self._committed_end(topic, partition))

    def _committed_end(self, topic: str, partition: int) -> int:
        low, high = partition_range(partition)
        (top,) = (
            self._reader(topic)
            .execute("SELECT max(id) FROM records WHERE id >= ? AND id < ?", (low, high))
            .fetchone()
        )
        return 0 if top is None else int(top) - low + 1

    def _open_writer(self, topic: str, partition: int, writer_id: str) -> PartitionWriter:
        def bump(transaction: Transaction) -> int:
            transaction.conn.execute(_WRITERS)  # topics created before fenced writers existed
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

    def __init__(self, log: SqliteLog, topic: str, partition: int, writer_id: str, epoch: int):
        self._log = log
        self.topic, self.partition, self.writer_id = topic, partition, writer_id
        self.epoch = epoch

    def append(self, records: Sequence[Record]) -> None:
        self._log._check_records(records)
        if not records:
            return

        def append(transaction: Transaction) -> AppendResult | None:
            row = transaction.conn.execute(
                "SELECT epoch FROM writers WHERE writer = ? AND partition = ?",
                (self.writer_id, self.partition),
            ).fetchone()
            if row is None or row[0] != self.epoch:
                return None  # superseded; never raise here: other appends share the transaction
            return transaction.add(self.partition, records, None, now_ms())

        if self._log._writer(self.topic).submit(append).result() is None:
            raise fenced(self.topic, self.partition, self.writer_id)

    def commit(self) -> None:
        """Nothing to do: every append was durable when it returned."""

    def close(self) -> None:
        """Nothing to release: the log owns the connection."""
