"""The embedded JobDB: one SQLite file in a directory (``sqlite://DIR``, the default).

Guarantee: a transaction is durable on return (WAL with ``synchronous=FULL``). Writers take
SQLite's write lock with ``BEGIN IMMEDIATE`` and wait for it (busy timeout), so the router and the
director may share the file. The director's lock is an ``flock`` on ``DIR/director.lock``, which
the kernel releases when its holder dies, however it dies; a partition's lease is an ``flock``
on ``DIR/partition-N.lock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from exactly.delivery.jobdb.base import HELD, RUNNING
from exactly.delivery.jobdb.sql import MARKER_COLUMNS, SQLJobDB
from exactly.errors import DirectorLockHeld, JobDBError, ReplayRunning
from exactly.sqlite_wal import write_ahead

FILE = "jobdb.sqlite"  # in the URL's directory


class SqliteJobDB(SQLJobDB):
    scheme = "sqlite"
    types: ClassVar[dict[str, str]] = {
        "id": "INTEGER",
        "serial": "INTEGER PRIMARY KEY",
        "text": "TEXT",
        "body": "TEXT",
        "blob": "BLOB",
        "real": "REAL",
    }
    _for_update = ""
    # SQLite before 3.32 binds at most 999 parameters a statement
    _insert_rows = 1000 if sqlite3.sqlite_version_info >= (3, 32) else 100

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self.directory = Path(url.partition("://")[2] or ".")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / FILE

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=60.0
        )
        write_ahead(connection, 60.0)  # processes opening a new file together: losers retry
        connection.execute("PRAGMA synchronous=FULL")
        return connection

    def _begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN IMMEDIATE")

    def _before_forget(self, cursor: Any) -> None:
        cursor.execute("PRAGMA secure_delete = ON")

    def _scrub(self, cursor: Any, tables: Sequence[str]) -> None:
        from exactly.sqlite_wal import empty_wal

        if not empty_wal(self.path):
            raise JobDBError(
                f"could not empty the write-ahead log of {self.path} (readers held it for "
                "30 s): its old pages stay until the forget is run again"
            )

    def _list_tables(self) -> str:
        return "SELECT name FROM sqlite_master WHERE type = 'table'"

    def _upsert_marker(self) -> str:
        return (
            f"INSERT INTO jobdb_markers ({MARKER_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (query_id) DO UPDATE SET batch_id = excluded.batch_id, "
            "stream = excluded.stream, end_offsets = excluded.end_offsets, "
            "committed_at = excluded.committed_at"
        )

    @contextlib.contextmanager
    def director_lock(self, *, wait: bool = True) -> Iterator[None]:
        descriptor = os.open(self.directory / "director.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not wait:
                        raise DirectorLockHeld(
                            f"another director holds {self.directory / 'director.lock'}; {HELD}"
                        ) from None
                    time.sleep(0.2)
            yield
        finally:
            os.close(descriptor)  # releases the flock

    _lease_files: dict[int, int] | None = None

    def _files(self) -> dict[int, int]:
        if self._lease_files is None:
            self._lease_files = {}
        return self._lease_files

    def take_partition(self, partition: int) -> bool:
        """An ``flock`` on ``DIR/partition-N.lock``: only the process's end releases it."""
        files = self._files()
        if partition in files:
            return True
        path = self.directory / f"partition-{partition}.lock"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return False
        files[partition] = descriptor
        return True

    def release_partition(self, partition: int) -> None:
        descriptor = self._files().pop(partition, None)
        if descriptor is not None:
            os.close(descriptor)  # releases the flock

    def held_partitions(self) -> set[int]:
        return set(self._files())

    def keep_partitions(self) -> None:
        """An flock cannot be lost while its process lives."""

    @contextlib.contextmanager
    def replay_lock(self, destination: str, kind: str = "replay") -> Iterator[None]:
        path = self.directory / f"{kind}-{destination}.lock"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ReplayRunning(
                    f"another {kind} of {destination!r} is running (it holds {path}); {RUNNING}"
                ) from None
            yield
        finally:
            os.close(descriptor)  # releases the flock
