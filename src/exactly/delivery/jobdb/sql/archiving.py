"""Archiving and dropping datasets: the director's upkeep, in the shared SQL."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from exactly.delivery import packs
from exactly.delivery.jobdb.base import ARCHIVED, ARCHIVING, PENDING, Job
from exactly.delivery.jobdb.sql.batching import Batching
from exactly.delivery.jobdb.sql.rows import JOB_COLUMNS, job_of
from exactly.errors import JobDBError

RECORD_PAGE = 2000  # jobs read at once when a dataset is archived


class Archiving(Batching):
    """``archivable`` and ``archive`` (a dataset at a time), ``drop_orphans`` (at start)."""

    def archivable(self) -> list[int]:
        """Closed datasets (not the newest) whose jobs are all terminal, archiving or archived."""
        with self._mutex:
            cursor = self._cursor()
            numbers = [dataset.number for dataset in self._load_datasets(cursor)[:-1]]
            ready = [number for number in numbers if self._finished(cursor, number)]
            self._connection.commit()
            return ready

    def _archivable(self, cursor: Any, number: int) -> bool:
        """:meth:`archivable` for one dataset: a scan of its own tables, not of every one."""
        numbers = [dataset.number for dataset in self._load_datasets(cursor)[:-1]]
        ready = number in numbers and self._finished(cursor, number)
        self._connection.commit()
        return ready

    def _finished(self, cursor: Any, number: int) -> bool:
        """Whether every job of dataset ``number`` is terminal, archiving or archived. The
        scan stops at the first job still pending, from the newest: jobs are delivered about
        in id order, so a dataset being delivered answers after a few rows, not all of them."""
        n = number
        self._execute(
            cursor,
            f"SELECT j.id FROM jobs_{n} j LEFT JOIN job_state_transitions_{n} t ON "
            f"t.id = (SELECT MAX(id) FROM job_state_transitions_{n} WHERE job_id = j.id) "
            "WHERE t.state IS NULL OR t.state IN (?, ?, ?) ORDER BY j.id DESC LIMIT 1",
            PENDING,
        )
        return cursor.fetchone() is None

    def archive(
        self,
        number: int,
        write: Callable[[Iterator[dict[str, Any]]], object],
        *,
        drop: bool = True,
    ) -> None:
        """Archive dataset ``number`` through ``write(records)`` and drop its tables.

        1. append ``archiving`` to every job not yet archiving (one statement);
        2. ``write`` every job with its transitions (an archive writer, idempotent per dataset:
           a crash before step 4 makes it run again);
        3. append ``archived`` to every job (one statement), commit;
        4. forget the dataset and the batches whose members were all in it or before, then
           ``DROP TABLE`` both tables.

        A dataset found all ``archived`` (a crash between steps 3 and 4) goes straight to step 4:
        its file was complete before step 3, and writing it again would add ``archived`` to it.
        """
        with self._mutex:
            ready = self._archivable(self._cursor(), number)
        if not ready:
            raise JobDBError(
                f"dataset {number} still has pending jobs or is the newest: it can be archived "
                "once every job in it is finished and a newer dataset exists"
            )
        with self._mutex:
            cursor = self._cursor()
            if not self._all_archived(cursor, number):
                self._mark(cursor, number, ARCHIVING)  # 1.
                write(self._records(cursor, number))  # 2.
                self._mark(cursor, number, ARCHIVED)  # 3.
            if not drop:
                return
            try:  # 4.
                self._begin(cursor)
                self._execute(cursor, "DELETE FROM jobdb_datasets WHERE number = ?", (number,))
                self._forget_batches(cursor)
                self._connection.commit()
                self._execute(cursor, f"DROP TABLE IF EXISTS job_state_transitions_{number}")
                self._execute(cursor, f"DROP TABLE IF EXISTS jobs_{number}")
                self._connection.commit()
            except BaseException:
                self._connection.rollback()
                raise
            self._load_datasets(cursor)

    def _all_archived(self, cursor: Any, number: int) -> bool:
        n = number
        self._execute(
            cursor,
            f"SELECT COUNT(*) FROM jobs_{n} j LEFT JOIN job_state_transitions_{n} t ON t.id = "
            f"(SELECT MAX(id) FROM job_state_transitions_{n} WHERE job_id = j.id) "
            "WHERE t.state IS NULL OR t.state <> ?",
            (ARCHIVED,),
        )
        left = int(cursor.fetchone()[0])
        self._connection.commit()
        return left == 0

    def _mark(self, cursor: Any, number: int, state: str) -> None:
        n = number
        try:
            self._begin(cursor)
            self._execute(
                cursor,
                f"INSERT INTO job_state_transitions_{n} (job_id, time, attempt, state) "
                f"SELECT j.id, ?, COALESCE(t.attempt, 0), ? FROM jobs_{n} j "
                f"LEFT JOIN job_state_transitions_{n} t ON t.id = (SELECT MAX(id) FROM "
                f"job_state_transitions_{n} WHERE job_id = j.id) WHERE t.state <> ? "
                "AND t.state <> ?",
                (time.time(), state, state, ARCHIVED),
            )
            self._connection.commit()
        except BaseException:
            self._connection.rollback()
            raise

    def _records(self, cursor: Any, number: int) -> Iterator[dict[str, Any]]:
        """Every job of dataset ``number`` with its transitions, by id, read in pages of
        :data:`RECORD_PAGE` jobs so memory stays small whatever the dataset holds."""
        names = ("time", "attempt", "state", "retry_at", "status_code", "error_type", "response")
        after = -1
        while True:
            self._execute(
                cursor,
                f"SELECT {JOB_COLUMNS} FROM jobs_{number} WHERE id > ? ORDER BY id LIMIT ?",
                (after, RECORD_PAGE),
            )
            jobs = [job_of((*row, None, None, None)) for row in cursor.fetchall()]
            if not jobs:
                self._connection.commit()
                return
            self._execute(
                cursor,
                "SELECT job_id, time, attempt, state, retry_at, status_code, error_type, "
                f"response FROM job_state_transitions_{number} WHERE job_id > ? AND job_id <= ? "
                "ORDER BY job_id, id",
                (after, jobs[-1].id),
            )
            steps: dict[int, list[dict[str, Any]]] = {}
            for row in cursor.fetchall():
                steps.setdefault(int(row[0]), []).append(dict(zip(names, row[1:], strict=True)))
            self._connection.commit()
            after = jobs[-1].id
            for job in jobs:
                yield from _job_records(job, steps.get(job.id, []))

    def drop_orphans(self) -> list[int]:
        """Drop dataset tables that ``jobdb_datasets`` does not list; the numbers dropped.

        Two crashes leave them: between forgetting an archived dataset and its ``DROP TABLE``
        (below the newest dataset: archived, safe to drop), and between creating a new
        dataset's tables and registering it (MariaDB commits on DDL; above the newest: empty,
        as jobs are only added in the registering transaction). A router may be registering
        that table right now, so each drop runs under a lock routers wait for (the backend's
        :meth:`_lock_datasets`) and checks again that no dataset lists it; a router that then
        finds its new tables gone creates them again (``add`` reads again and retries).
        """
        with self._mutex:
            cursor = self._cursor()
            listed = {dataset.number for dataset in self._load_datasets(cursor)}
            tables = self._dataset_tables(cursor)
            self._connection.commit()
            dropped: list[int] = []
            for number in sorted({n for _, n in tables} - listed):
                names = [f"{kind}_{n}" for kind, n in sorted(tables) if n == number]
                try:
                    self._lock_datasets(cursor, names)
                    self._execute(
                        cursor, "SELECT COUNT(*) FROM jobdb_datasets WHERE number = ?", (number,)
                    )
                    if int(cursor.fetchone()[0]) == 0:
                        for name in sorted(names, reverse=True):  # jobs_N first: add checks it
                            self._execute(cursor, f"DROP TABLE IF EXISTS {name}")
                        dropped.append(number)
                    self._unlock_datasets(cursor)
                except BaseException:
                    self._connection.rollback()
                    self._unlock_datasets(cursor)
                    raise
            self._load_datasets(cursor)
            return dropped

    def _dataset_tables(self, cursor: Any) -> set[tuple[str, int]]:
        """Every ``(jobs | job_state_transitions, N)`` table in the database."""
        self._execute(cursor, self._list_tables())
        found: set[tuple[str, int]] = set()
        for (name,) in cursor.fetchall():
            kind, _, number = str(name).rpartition("_")
            if kind in ("jobs", "job_state_transitions") and number.isdigit():
                found.add((kind, int(number)))
        return found


def _job_records(job: Job, transitions: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A job's archive record; a pack's, one per member, each with the pack's key as
    ``batch`` and its id and transitions (a member was sent, and ended, with its pack)."""
    record = {
        "id": job.id,
        "bucket": job.bucket,
        "destination": job.destination,
        "payload": job.payload.decode("utf-8", "replace"),
        "message_id": job.message_id,
        "user_id": job.user_id,
        "created_at": job.created_at,
        "expire_at": job.expire_at,
        "transitions": transitions,
    }
    if not job.packed:
        yield record
        return
    for member in packs.members(job.payload):
        yield {
            **record,
            "payload": member.payload.decode("utf-8", "replace"),
            "message_id": member.message_id,
            "user_id": member.user_id,
            "batch": job.message_id,
        }
