"""The director's side of the shared SQL: buckets, paging jobs in, recording transitions."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from exactly.delivery.jobdb.base import (
    MAX_RESPONSE,
    PENDING,
    STATES,
    Batch,
    BatchStep,
    Dataset,
    Job,
    Transition,
)
from exactly.delivery.jobdb.sql.batching import Batching


class Directing(Batching):
    """What the director reads and writes while it delivers."""

    def buckets(self) -> list[str]:
        """Buckets that have jobs in a live dataset.

        Jobs are only ever added to the newest dataset (``add`` locks its row), so a dataset's
        buckets are final once a newer one is listed: those are read once and kept, and only
        the newest dataset is scanned on each call (a backlog of many datasets costs one)."""
        with self._mutex:
            cursor = self._cursor()
            found: set[str] = set()
            datasets = self._load_datasets(cursor)
            newest = max((dataset.number for dataset in datasets), default=None)
            for dataset in datasets:
                known = self._closed_buckets.get(dataset.number)
                if known is None:
                    self._execute(cursor, f"SELECT DISTINCT bucket FROM jobs_{dataset.number}")
                    known = {str(row[0]) for row in cursor}
                    if dataset.number != newest:
                        self._closed_buckets[dataset.number] = known
                found |= known
            self._connection.commit()
            live = {dataset.number for dataset in datasets}
            for number in set(self._closed_buckets) - live:  # archived and dropped
                del self._closed_buckets[number]
            return sorted(found)

    def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``bucket`` not yet terminal, by id, with ids above ``after``."""
        return self._page(
            after,
            limit,
            "",
            (),
            "j.bucket = ? AND (t.state IS NULL OR t.state IN (?, ?, ?))",
            (bucket, *PENDING),
        )

    def unpaged(self, bucket: str, *, after: int) -> int:
        """How many jobs of ``bucket`` have ids above ``after`` (an index range count)."""
        with self._mutex:
            cursor = self._cursor()
            count = 0
            for dataset in self._load_datasets(cursor):
                if dataset.first_id + dataset.rows <= after + 1:
                    continue
                self._execute(
                    cursor,
                    f"SELECT COUNT(*) FROM jobs_{dataset.number} WHERE bucket = ? AND id > ?",
                    (bucket, after),
                )
                count += int(cursor.fetchone()[0])
            self._connection.commit()
            return count

    def record(
        self,
        transitions: Sequence[Transition],
        *,
        batches: Sequence[Batch] = (),
        steps: Sequence[BatchStep] = (),
    ) -> None:
        """Append ``transitions``, ``batches`` and their ``steps`` in one transaction, durable
        on return (the director's write)."""
        if not transitions and not batches and not steps:
            return
        with self._mutex:
            cursor = self._cursor()
            now = time.time()
            by_dataset: dict[int, list[tuple[Any, ...]]] = {}
            for step in transitions:
                if step.state not in STATES:
                    raise ValueError(f"unknown job state {step.state!r}")
                number = self._dataset_of(cursor, step.job_id)
                response = None if step.response is None else step.response[:MAX_RESPONSE]
                by_dataset.setdefault(number, []).append(
                    (
                        step.job_id,
                        step.time or now,
                        step.attempt,
                        step.state,
                        step.retry_at,
                        step.status_code,
                        step.error_type,
                        response,
                    )
                )
            try:
                self._begin(cursor)
                self._write_batches(cursor, batches, steps, now)
                for number, rows in by_dataset.items():
                    cursor.executemany(
                        self._sql(
                            f"INSERT INTO job_state_transitions_{number} (job_id, time, attempt, "
                            "state, retry_at, status_code, error_type, response) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                        ),
                        rows,
                    )
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()

    def datasets(self) -> list[Dataset]:
        with self._mutex:
            return list(self._load_datasets(self._cursor()))
