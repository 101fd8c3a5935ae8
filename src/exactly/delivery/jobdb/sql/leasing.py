"""Partition leases and directors' heartbeats in the shared SQL.

A lease is a lock the server keeps for a session (PostgreSQL's advisory lock, MariaDB's
``GET_LOCK``; the backend gives the statements) and it is taken **on the connection the
director writes on**. So when that session ends, however it ends (the process killed, the
backend terminated, the server restarted), its leases go with it, and a write that commits was
made by a session that held them. A new connection takes the leases again before its first
statement (:meth:`Leasing._connected`); if another director took one meanwhile it raises
:class:`~exactly.errors.PartitionLost` and the director stops, sending nothing more.

SQLite's leases are ``flock`` s on files (``sqlite.py`` overrides the lease methods); only the
process's death releases them.

``jobdb_directors`` holds a row per live director (its name, its partitions, when last seen),
written every second: how a director counts the live ones to keep its fair share.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

from exactly.delivery.jobdb.base import HELD, STALE
from exactly.delivery.jobdb.sql.schema import SQLSchema
from exactly.errors import DirectorLockHeld, PartitionLost

RETAKE_SECONDS = 2.0  # how long a new connection tries again for a lease its old one held

FORGET = 60.0  # seconds: a heartbeat this old is deleted by the next director's


class Leasing(SQLSchema):
    """Leases held on the director's own connection, and the heartbeats' table."""

    _leases: set[int] | None = None
    _directors_created = False

    # -- what a backend with session locks provides --------------------------------------------

    def _try_lease(self, cursor: Any, partition: int) -> bool:
        """Take ``partition``'s session lock on this connection without waiting."""
        raise NotImplementedError

    def _drop_lease(self, cursor: Any, partition: int) -> None:
        """Release ``partition``'s session lock on this connection."""
        raise NotImplementedError

    # -- leases ---------------------------------------------------------------------------------

    def _held(self) -> set[int]:
        if self._leases is None:
            self._leases = set()
        return self._leases

    def take_partition(self, partition: int) -> bool:
        """Take the lease of ``partition`` without waiting; whether it is now held here. A
        lease is released by the database or the kernel when its holder dies."""
        with self._mutex:
            if partition in self._held():
                return True
            cursor = self._cursor()
            try:
                taken = self._try_lease(cursor, partition)
                self._connection.commit()
            except BaseException:
                self._connection.rollback()
                raise
            if taken:
                self._held().add(partition)
            return taken

    def release_partition(self, partition: int) -> None:
        """Release the lease of ``partition`` (only once nothing of it is being sent)."""
        with self._mutex:
            if partition not in self._held():
                return
            self._held().discard(partition)
            if self._connection is None:
                return  # gone with its connection
            cursor = self._connection.cursor()
            try:
                self._drop_lease(cursor, partition)
                self._connection.commit()
            except BaseException:
                self._connection.rollback()
                raise

    def held_partitions(self) -> set[int]:
        """The partitions whose lease this JobDB object holds."""
        return set(self._held())

    def keep_partitions(self) -> None:
        """A statement on the connection that holds the leases: a new connection (the old one
        lost) takes them again first, or raises PartitionLost."""
        with self._mutex:
            if not self._held():
                return
            cursor = self._cursor()
            self._execute(cursor, "SELECT 1")
            cursor.fetchall()
            self._connection.commit()

    @contextlib.contextmanager
    def all_partitions(self, partitions: int, *, wait: bool = False) -> Iterator[None]:
        """Hold every partition's lease while inside (no director delivers meanwhile); wait for
        them, or raise DirectorLockHeld at once when one is held elsewhere."""
        taken: list[int] = []
        try:
            for partition in range(partitions):
                while not self.take_partition(partition):
                    if not wait:
                        raise DirectorLockHeld(
                            f"a director holds partition {partition} of {self.describe()}; {HELD}"
                        )
                    time.sleep(0.2)
                taken.append(partition)
            yield
        finally:
            for partition in taken:
                with contextlib.suppress(Exception):
                    self.release_partition(partition)

    def _connected(self) -> None:
        """Take the leases this object held again, on its new connection.

        The server frees the old session's locks as it tears that session down, which may
        finish a moment after the new connection is made: a lease still held is tried again
        for :data:`RETAKE_SECONDS` before it counts as taken by another director. Only the
        missing ones are tried again (a session takes its own advisory lock twice otherwise)."""
        held = self._held()
        if not held:
            return
        cursor = self._connection.cursor()
        lost = sorted(held)
        deadline = time.monotonic() + RETAKE_SECONDS
        while True:
            lost = [partition for partition in lost if not self._try_lease(cursor, partition)]
            self._connection.commit()
            if not lost or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if lost:
            held.difference_update(lost)
            raise PartitionLost(
                f"partitions {', '.join(map(str, lost))} of {self.describe()} were taken by "
                "another director while this one's connection was lost; this director stops "
                "(a restart takes free partitions again)"
            )

    # -- heartbeats -----------------------------------------------------------------------------

    def _create_directors(self, cursor: Any) -> None:
        if self._directors_created:
            return
        t = self.types
        self._create_table(
            cursor,
            "jobdb_directors",
            f"CREATE TABLE IF NOT EXISTS jobdb_directors (director {t['text']} PRIMARY KEY, "
            f"partitions {t['body']} NOT NULL, seen_at {t['real']} NOT NULL)",
        )
        self._directors_created = True

    def heartbeat(self, director: str, partitions: Sequence[int], now: float) -> int:
        """Record that ``director`` is alive holding ``partitions``; how many directors are
        live (a heartbeat within :data:`STALE` seconds, this one included)."""
        held = json.dumps(sorted(partitions))
        with self._mutex:
            cursor = self._cursor()
            self._create_directors(cursor)
            try:
                self._begin(cursor)
                self._execute(
                    cursor,
                    "UPDATE jobdb_directors SET partitions = ?, seen_at = ? WHERE director = ?",
                    (held, now, director),
                )
                if cursor.rowcount == 0:  # only this director writes its row
                    self._execute(
                        cursor,
                        "INSERT INTO jobdb_directors (director, partitions, seen_at) "
                        "VALUES (?, ?, ?)",
                        (director, held, now),
                    )
                self._execute(
                    cursor,
                    "SELECT COUNT(*) FROM jobdb_directors WHERE seen_at >= ? OR director = ?",
                    (now - STALE, director),
                )
                live = int(cursor.fetchone()[0])
                self._connection.commit()
                # Forgetting the long gone is a transaction of its own: inside the one above,
                # its scan would wait for the rows other directors are inserting while they
                # wait for this one's (MariaDB reports a deadlock when directors start together)
                self._begin(cursor)
                self._execute(
                    cursor, "DELETE FROM jobdb_directors WHERE seen_at < ?", (now - FORGET,)
                )
                self._connection.commit()
            except BaseException:
                self._connection.rollback()
                raise
            return live

    def leave(self, director: str) -> None:
        """Forget ``director``'s heartbeat (it stops)."""
        with self._mutex:
            cursor = self._cursor()
            self._create_directors(cursor)
            self._begin(cursor)
            self._execute(cursor, "DELETE FROM jobdb_directors WHERE director = ?", (director,))
            self._connection.commit()

    def directors(self) -> list[tuple[str, list[int], float]]:
        """Every director's heartbeat: its name, partitions and when it was last seen."""
        with self._mutex:
            cursor = self._cursor()
            self._create_directors(cursor)
            self._execute(
                cursor,
                "SELECT director, partitions, seen_at FROM jobdb_directors ORDER BY director",
            )
            rows = cursor.fetchall()
            self._connection.commit()
        return [(str(name), list(json.loads(held)), float(seen)) for name, held, seen in rows]
