"""``exactly forget``'s side of the JobDB: a person's jobs expired and emptied, in every dataset.

Run while no director sends (the caller holds every partition, as ``deliveries expire`` does):
a pack the route query made (:mod:`exactly.delivery.packs`) loses the person's members and
keeps the others, sent as before; a queued job of the person (or a pack of theirs alone) gets a
terminal ``expired`` transition (error type ``forgotten``), so it is never sent; every job of
theirs has its payload emptied and its ``user_id`` cleared, and every transition of it its
response (a receiver's answer may quote the payload), as has every step of a batch that held
one. Then the backend's scrub (:meth:`SQLSchema._scrub`) removes the old bytes: SQLite's
``secure_delete`` and an emptied WAL, PostgreSQL's ``VACUUM``, MariaDB's ``OPTIMIZE TABLE``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from exactly.delivery import packs
from exactly.delivery.jobdb.base import EXPIRED, TERMINAL
from exactly.delivery.jobdb.sql.schema import SQLSchema

FORGOTTEN = "forgotten"  # the error type of the transition that expires a forgotten person's job
Matches = Callable[[str, "str | None", bytes], bool]  # message id, user id, payload
CHUNK = 500  # ids per statement


class Forgetting(SQLSchema):
    """:meth:`forget_jobs`."""

    def forget_jobs(self, matches: Matches) -> tuple[int, int]:
        """Expire the queued jobs ``matches`` picks and empty all it picks; (expired, emptied).
        Only while no director runs."""
        expired = emptied = 0
        forgotten_ids: set[int] = set()
        with self._mutex:
            cursor = self._cursor()
            self._before_forget(cursor)
            for dataset in self._load_datasets(cursor):
                number = dataset.number
                self._execute(cursor, f"SELECT id, message_id, user_id, payload FROM jobs_{number}")
                picked: list[int] = []
                trimmed: list[tuple[int, bytes, int]] = []  # packs with members left
                for job_id, message_id, user_id, payload in cursor.fetchall():
                    found = bytes(payload or b"")
                    if not packs.is_packed(found):
                        if found and matches(str(message_id), user_id, found):
                            picked.append(int(job_id))
                        continue
                    kept, gone = packs.trim(found, lambda m: matches(*m))
                    if kept is None:
                        picked.append(int(job_id))
                    elif gone:
                        trimmed.append((int(job_id), kept, packs.count(kept)))
                        emptied += gone
                self._connection.commit()
                if not picked and not trimmed:
                    continue
                try:
                    self._begin(cursor)
                    self._trim(cursor, number, trimmed)
                    expired += self._expire(cursor, number, picked)
                    for chunk in _chunks(picked):
                        marks = ", ".join("?" * len(chunk))
                        self._execute(
                            cursor,
                            f"UPDATE jobs_{number} SET payload = ?, user_id = NULL "
                            f"WHERE id IN ({marks})",
                            (b"", *chunk),
                        )
                        self._execute(
                            cursor,
                            f"UPDATE job_state_transitions_{number} SET response = NULL "
                            f"WHERE job_id IN ({marks})",
                            tuple(chunk),
                        )
                except BaseException:
                    self._connection.rollback()
                    raise
                self._connection.commit()
                emptied += len(picked)
                forgotten_ids.update(picked)
                forgotten_ids.update(job_id for job_id, _, _ in trimmed)
            if forgotten_ids:
                self._forget_batch_steps(cursor, forgotten_ids)
            # every table, changed now or not: an earlier forget may have been killed between
            # its changes and its scrub
            tables = [
                f"{kind}_{dataset.number}"
                for dataset in self._load_datasets(cursor)
                for kind in ("jobs", "job_state_transitions")
            ]
            self._scrub(cursor, [*tables, "jobdb_batch_steps"])
        return expired, emptied

    def _trim(self, cursor: Any, number: int, trimmed: Sequence[tuple[int, bytes, int]]) -> None:
        """Packs with some members forgotten: the rest kept (and still sent, under the same
        key), the responses of their transitions emptied."""
        for job_id, payload, events in trimmed:
            self._execute(
                cursor,
                f"UPDATE jobs_{number} SET payload = ?, events = ? WHERE id = ?",
                (payload, events, job_id),
            )
            self._execute(
                cursor,
                f"UPDATE job_state_transitions_{number} SET response = NULL WHERE job_id = ?",
                (job_id,),
            )

    def _expire(self, cursor: Any, number: int, picked: Sequence[int]) -> int:
        """A terminal ``expired`` transition for each picked job not already terminal."""
        latest: dict[int, tuple[str, int]] = {}
        for chunk in _chunks(picked):
            marks = ", ".join("?" * len(chunk))
            self._execute(
                cursor,
                f"SELECT job_id, state, attempt FROM job_state_transitions_{number} "
                f"WHERE job_id IN ({marks}) ORDER BY id",
                tuple(chunk),
            )
            for job_id, state, attempt in cursor.fetchall():
                latest[int(job_id)] = (str(state), int(attempt))
        now = time.time()
        rows = [
            (job_id, now, latest.get(job_id, ("", 0))[1], EXPIRED, FORGOTTEN)
            for job_id in picked
            if latest.get(job_id, ("", 0))[0] not in TERMINAL
        ]
        if rows:
            cursor.executemany(
                self._sql(
                    f"INSERT INTO job_state_transitions_{number} "
                    "(job_id, time, attempt, state, error_type) VALUES (?, ?, ?, ?, ?)"
                ),
                rows,
            )
        return len(rows)

    def _forget_batch_steps(self, cursor: Any, jobs: set[int]) -> None:
        self._execute(cursor, "SELECT id, job_ids FROM jobdb_batches")
        batches = [
            str(batch_id)
            for batch_id, members in cursor.fetchall()
            if jobs.intersection(_members(members))
        ]
        self._connection.commit()
        if not batches:
            return
        try:
            self._begin(cursor)
            for chunk in _chunks(batches):
                marks = ", ".join("?" * len(chunk))
                self._execute(
                    cursor,
                    f"UPDATE jobdb_batch_steps SET response = NULL WHERE batch_id IN ({marks})",
                    tuple(chunk),
                )
        except BaseException:
            self._connection.rollback()
            raise
        self._connection.commit()

    def _before_forget(self, cursor: Any) -> None:
        """Make this connection's deletes and updates leave no old bytes (SQLite)."""

    def _scrub(self, cursor: Any, tables: Sequence[str]) -> None:
        """Remove the old bytes of rows changed in ``tables`` (each backend its own way)."""


def _members(text: Any) -> list[int]:
    """A batch's job ids, as ``jobdb_batches.job_ids`` keeps them (comma-separated)."""
    found = text if isinstance(text, str) else bytes(text).decode()
    return [int(job_id) for job_id in found.split(",") if job_id]


def _chunks(items: Sequence[Any]) -> list[Sequence[Any]]:
    return [items[start : start + CHUNK] for start in range(0, len(items), CHUNK)]
