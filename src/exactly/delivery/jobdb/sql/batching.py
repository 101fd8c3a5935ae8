"""Batches in the shared SQL: a row per batch, a row per attempt, and what a restart resends.

``jobdb_batches`` holds each batch once (id, bucket, destination, its members' ids in body
order, the first and last of them); ``jobdb_batch_steps`` its history, as
``job_state_transitions_N`` holds a job's. A member job gets no row while its batch is out (the
batch's row lists it) and its terminal state when the batch ends, written with the batch's step
in the same transaction (:meth:`Directing.record`); the attempts are batch steps only.
A batch's rows are deleted once no live dataset holds any of its members (:meth:`_forget_batches`,
with the dataset's drop).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    EXECUTING,
    MAX_RESPONSE,
    STATES,
    Batch,
    BatchStep,
    OpenBatch,
)
from exactly.delivery.jobdb.sql.schema import SQLSchema

STEP_COLUMNS = "batch_id, state, attempt, time, retry_at, status_code, error_type, response"


def _step_of(row: Sequence[Any]) -> BatchStep:
    return BatchStep(
        str(row[0]),
        str(row[1]),
        int(row[2]),
        float(row[3]),
        None if row[4] is None else float(row[4]),
        None if row[5] is None else int(row[5]),
        row[6],
        row[7],
    )


def _batch_of(row: Sequence[Any]) -> Batch:
    """A batch from ``id, bucket, destination, job_ids, created_at``."""
    ids = tuple(int(part) for part in str(row[3]).split(","))
    return Batch(str(row[0]), str(row[1]), str(row[2]), ids, float(row[4]))


class Batching(SQLSchema):
    """Writing batches and their steps (inside ``record``'s transaction), reading them back."""

    def _write_batches(
        self, cursor: Any, batches: Sequence[Batch], steps: Sequence[BatchStep], now: float
    ) -> None:
        """Insert ``batches`` and ``steps``; the caller's transaction is open."""
        if batches:
            cursor.executemany(
                self._sql(
                    "INSERT INTO jobdb_batches (id, bucket, destination, first_job, last_job, "
                    "job_ids, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                [
                    (
                        batch.id,
                        batch.bucket,
                        batch.destination,
                        min(batch.job_ids),
                        max(batch.job_ids),
                        ",".join(str(job_id) for job_id in batch.job_ids),
                        batch.created_at or now,
                    )
                    for batch in batches
                ],
            )
        if steps:
            for step in steps:
                if step.state not in STATES:
                    raise ValueError(f"unknown batch state {step.state!r}")
            cursor.executemany(
                self._sql(
                    "INSERT INTO jobdb_batch_steps (batch_id, time, attempt, state, retry_at, "
                    "status_code, error_type, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                [
                    (
                        step.batch_id,
                        step.time or now,
                        step.attempt,
                        step.state,
                        step.retry_at,
                        step.status_code,
                        step.error_type,
                        None if step.response is None else step.response[:MAX_RESPONSE],
                    )
                    for step in steps
                ],
            )

    def open_batches(self, bucket: str) -> list[OpenBatch]:
        """The batches of ``bucket`` whose latest step is ``executing`` or ``awaiting-retry``,
        oldest first, each with its member jobs in body order."""
        with self._mutex:
            cursor = self._cursor()
            self._execute(
                cursor,
                "SELECT b.id, b.bucket, b.destination, b.job_ids, b.created_at, s.state, "
                "s.attempt, s.retry_at FROM jobdb_batches b JOIN jobdb_batch_steps s ON s.id = "
                "(SELECT MAX(id) FROM jobdb_batch_steps WHERE batch_id = b.id) "
                "WHERE b.bucket = ? AND s.state IN (?, ?) ORDER BY b.first_job",
                (bucket, EXECUTING, AWAITING_RETRY),
            )
            rows = cursor.fetchall()
            self._connection.commit()
            found: list[OpenBatch] = []
            for row in rows:
                batch = _batch_of(row)
                first, last = min(batch.job_ids), max(batch.job_ids)
                members = set(batch.job_ids)
                page = self._page(
                    first - 1,
                    last - first + 1,
                    "",
                    (),
                    "j.bucket = ? AND j.id <= ?",
                    (bucket, last),
                )
                by_id = {job.id: job for job in page if job.id in members}
                jobs = tuple(by_id[job_id] for job_id in batch.job_ids if job_id in by_id)
                retry_at = None if row[7] is None else float(row[7])
                found.append(OpenBatch(batch, jobs, str(row[5]), int(row[6]), retry_at))
            return found

    def batch_history(self, batch_id: str) -> tuple[Batch, list[BatchStep]] | None:
        """A batch with every step of it, oldest first; None once its datasets are dropped."""
        with self._mutex:
            cursor = self._cursor()
            self._execute(
                cursor,
                "SELECT id, bucket, destination, job_ids, created_at FROM jobdb_batches "
                "WHERE id = ?",
                (batch_id,),
            )
            row = cursor.fetchone()
            if row is None:
                self._connection.commit()
                return None
            self._execute(
                cursor,
                f"SELECT {STEP_COLUMNS} FROM jobdb_batch_steps WHERE batch_id = ? ORDER BY id",
                (batch_id,),
            )
            steps = [_step_of(step) for step in cursor.fetchall()]
            self._connection.commit()
            return _batch_of(row), steps

    def batch_of(self, destination: str, job_id: int) -> str | None:
        """The id of the batch ``job_id`` was sent in to ``destination``; None for a job sent
        on its own (or not sent yet)."""
        with self._mutex:
            cursor = self._cursor()
            self._execute(
                cursor,
                "SELECT id, job_ids FROM jobdb_batches "
                "WHERE destination = ? AND first_job <= ? AND last_job >= ?",
                (destination, job_id, job_id),
            )
            rows = cursor.fetchall()
            self._connection.commit()
        wanted = str(job_id)
        return next((str(row[0]) for row in rows if wanted in str(row[1]).split(",")), None)

    def _forget_batches(self, cursor: Any) -> None:
        """Delete the batches whose members are all in dropped datasets (below the oldest live
        job id) with their steps; inside the caller's transaction."""
        self._execute(cursor, "SELECT MIN(first_id) FROM jobdb_datasets")
        (oldest,) = cursor.fetchone()
        if oldest is None:
            return
        self._execute(
            cursor,
            "DELETE FROM jobdb_batch_steps WHERE batch_id IN "
            "(SELECT id FROM jobdb_batches WHERE last_job < ?)",
            (int(oldest),),
        )
        self._execute(cursor, "DELETE FROM jobdb_batches WHERE last_job < ?", (int(oldest),))
