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
    Members,
    Transition,
)
from exactly.delivery.jobdb.sql.batching import Batching

#: a dataset's buckets by a skip scan of its ``(bucket, id)`` index: the least bucket, then the
#: least one above it, and so on (SQLite and PostgreSQL read every job's index entry for
#: ``SELECT DISTINCT bucket``; MariaDB skips by itself and is slower at this query)
DISTINCT_BUCKETS = (
    "WITH RECURSIVE b (bucket) AS (SELECT MIN(bucket) FROM jobs_{n} UNION ALL "
    "SELECT (SELECT MIN(bucket) FROM jobs_{n} WHERE bucket > b.bucket) FROM b "
    "WHERE b.bucket IS NOT NULL) SELECT bucket FROM b WHERE bucket IS NOT NULL"
)


class Directing(Batching):
    """What the director reads and writes while it delivers."""

    _distinct_buckets = DISTINCT_BUCKETS  # a backend's query for a dataset's buckets ({n})

    def buckets(self) -> list[str]:
        """Buckets that have jobs in a live dataset.

        Jobs are only ever added to the newest dataset (``add`` locks its row), so a dataset's
        buckets are final once a newer one is listed: those are read once and kept, and only
        the newest dataset is read on each call (a backlog of many datasets costs one), and
        that by skipping from one bucket to the next in its ``(bucket, id)`` index (a query per
        bucket, not a scan of its jobs: :data:`DISTINCT_BUCKETS`, or the backend's own)."""
        with self._mutex:
            cursor = self._cursor()
            found: set[str] = set()
            datasets = self._load_datasets(cursor)
            newest = max((dataset.number for dataset in datasets), default=None)
            for dataset in datasets:
                known = self._closed_buckets.get(dataset.number)
                if known is None:
                    self._execute(cursor, self._distinct_buckets.format(n=dataset.number))
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
        members: Sequence[Members] = (),
    ) -> None:
        """Append ``transitions``, ``batches`` with their ``steps`` and the transitions
        ``members`` stand for in one transaction, durable on return (the director's write).

        Rows are made per dataset with a comprehension, and a batch's members' rows from their
        ids alone: the director's one write thread spends little Python per job."""
        if not transitions and not batches and not steps and not members:
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
            for group in members:
                if not group.job_ids:
                    continue
                if group.state not in STATES:
                    raise ValueError(f"unknown job state {group.state!r}")
                response = None if group.response is None else group.response[:MAX_RESPONSE]
                values = (
                    group.time or now,
                    group.attempt,
                    group.state,
                    group.retry_at,
                    group.status_code,
                    group.error_type,
                    response,
                )
                for number, ids in self._by_dataset(cursor, group.job_ids):
                    by_dataset.setdefault(number, []).extend([(i, *values) for i in ids])
            try:
                self._begin(cursor)
                self._write_batches(cursor, batches, steps, now)
                for number, rows in by_dataset.items():
                    self._insert(
                        cursor,
                        f"job_state_transitions_{number} (job_id, time, attempt, state, "
                        "retry_at, status_code, error_type, response)",
                        rows,
                        big=7,
                    )
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()

    def _by_dataset(self, cursor: Any, job_ids: Sequence[int]) -> list[tuple[int, list[int]]]:
        """``job_ids`` split by the dataset holding each (a batch's members are in one, or
        two when it spans a roll-over)."""
        low, high = min(job_ids), max(job_ids)
        first, last = self._dataset_of(cursor, low), self._dataset_of(cursor, high)
        if first == last:
            return [(first, list(job_ids))]
        found: dict[int, list[int]] = {}
        for job_id in job_ids:
            found.setdefault(self._dataset_of(cursor, job_id), []).append(job_id)
        return list(found.items())

    def datasets(self) -> list[Dataset]:
        """The live datasets, oldest first."""
        with self._mutex:
            return list(self._load_datasets(self._cursor()))
