"""The router's side of the shared SQL: a micro-batch's jobs with their marker, once."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from exactly.delivery.jobdb.base import FAILED, Dataset, NewJob, RouteCounts, Span
from exactly.delivery.jobdb.runs import events_of, job_rows
from exactly.delivery.jobdb.sql.coverage import Covering
from exactly.delivery.jobdb.sql.rows import JOB_COLUMNS


class Routing(Covering):
    """``add``, ``marker`` and ``end_offsets`` (the route query's and backfill's),
    ``move_marker`` (replay's)."""

    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        stream: str | None = None,
        end_offsets: Mapping[int, int] | None = None,
        counts: Mapping[str, RouteCounts] | None = None,
        origin: str = "route",
        span: Span | None = None,
    ) -> int:
        """Add a micro-batch's jobs with its marker in one transaction; how many were added.

        1. lock the newest dataset's row (the router's turn);
        2. read the marker: a batch id not above it was committed before, so add nothing;
        3. insert the jobs into the newest dataset, or into a new one when it is full or old;
           a job whose transform failed (``error``) gets its ``failed`` transition with it;
        4. add ``counts`` to ``origin``'s counts of events not sent, per destination, and
           keep a backfill's ``span`` (what it has now routed);
        5. move the marker to ``batch_id``, with ``stream`` and ``end_offsets``; commit.
        """
        offsets = None
        if end_offsets is not None:
            offsets = json.dumps({str(p): int(end_offsets[p]) for p in sorted(end_offsets)})
        marker = (query_id, batch_id, stream, offsets)
        with self._mutex:
            cursor = self._cursor()
            failures = 0
            while True:
                newest = self._datasets[-1] if self._datasets else self._load_datasets(cursor)[-1]
                adding = events_of(jobs)
                if self._legacy_dataset(cursor, newest.number) or self._full(newest, adding):
                    try:
                        self._index_messages(cursor, newest.number)  # before it is closed
                        self._create_dataset(cursor, newest.number + 1)  # DDL before the txn
                    except Exception:  # tables dropped half made by drop_orphans: make them again
                        self._connection.rollback()
                        failures += 1
                        if failures > 5:
                            raise
                        self._load_datasets(cursor)
                        continue
                try:
                    added = self._add(cursor, jobs, marker, counts or {}, origin, span)
                except _Retry:
                    self._connection.rollback()
                    self._load_datasets(cursor)
                    continue
                except BaseException:
                    self._connection.rollback()
                    raise
                self._connection.commit()
                self._load_datasets(cursor)
                return added

    def _full(self, dataset: Dataset, adding: int) -> bool:
        old = time.time() - dataset.created_at > self.dataset_minutes * 60
        return dataset.rows > 0 and (dataset.rows + adding > self.dataset_rows or old)

    def _add(
        self,
        cursor: Any,
        jobs: Sequence[NewJob],
        marker: tuple[str, int, str | None, str | None],
        counts: Mapping[str, RouteCounts],
        origin: str,
        span: Span | None = None,
    ) -> int:
        query_id, batch_id = marker[0], marker[1]
        self._begin(cursor)
        # 1. lock the newest dataset's row
        self._execute(
            cursor,
            "SELECT number, first_id, n_rows, created_at FROM jobdb_datasets "
            f"WHERE number = (SELECT MAX(number) FROM jobdb_datasets){self._for_update}",
        )
        number, first_id, rows, created_at = cursor.fetchone()
        newest = Dataset(int(number), int(first_id), int(rows), float(created_at))
        # 2. the marker
        self._execute(cursor, "SELECT batch_id FROM jobdb_markers WHERE query_id = ?", (query_id,))
        last = cursor.fetchone()
        if last is not None and int(last[0]) >= batch_id:
            return 0
        # 3. the jobs: a pack takes as many ids as it has members (the dataset fills by events)
        now = time.time()
        target = newest
        adding = events_of(jobs)
        if newest.number not in self._legacy:  # made by another router meanwhile: check it
            raise _Retry
        if self._legacy[newest.number] or self._full(newest, adding):
            target = Dataset(newest.number + 1, newest.first_id + newest.rows, 0, now)
            if not self._dataset_exists(cursor, target.number):
                raise _Retry
            self._execute(
                cursor,
                "INSERT INTO jobdb_datasets (number, first_id, n_rows, created_at) "
                "VALUES (?, ?, ?, ?)",
                (target.number, target.first_id, 0, now),
            )
        rows, failed = job_rows(jobs, target.first_id + target.rows, now)
        self._insert(cursor, f"jobs_{target.number} ({JOB_COLUMNS}, events)", rows, big=3)
        self._insert(
            cursor,
            f"job_state_transitions_{target.number} "
            "(job_id, time, attempt, state, error_type, response)",
            [(job_id, now, 0, FAILED, "transform", error) for job_id, error in failed],
            big=5,
        )
        self._execute(
            cursor,
            "UPDATE jobdb_datasets SET n_rows = ? WHERE number = ?",
            (target.rows + adding, target.number),
        )
        # 4. the counts: under the dataset row's lock, so a read then a write is safe
        for destination, more in sorted(counts.items()):
            if more:
                self._add_counts(cursor, destination, origin, more, now)
        if span is not None:
            self._keep_span(cursor, span, now)
        # 5. the marker
        self._execute(cursor, self._upsert_marker(), (*marker, now))
        return len(jobs)

    def _add_counts(
        self, cursor: Any, destination: str, origin: str, more: RouteCounts, now: float
    ) -> None:
        key = (destination, origin)
        self._execute(
            cursor,
            "SELECT 1 FROM jobdb_route_counts WHERE destination = ? AND origin = ?",
            key,
        )
        values = (more.filtered, more.skipped, more.dropped, now)
        if cursor.fetchone() is None:
            self._execute(
                cursor,
                "INSERT INTO jobdb_route_counts (destination, origin, filtered, skipped, "
                "dropped, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                (*key, *values),
            )
        else:
            self._execute(
                cursor,
                "UPDATE jobdb_route_counts SET filtered = filtered + ?, skipped = skipped + ?, "
                "dropped = dropped + ?, updated_at = ? WHERE destination = ? AND origin = ?",
                (*values, *key),
            )

    def marker(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""
        with self._mutex:
            cursor = self._execute(
                self._cursor(), "SELECT batch_id FROM jobdb_markers WHERE query_id = ?", (query_id,)
            )
            row = cursor.fetchone()
            self._connection.commit()
            return None if row is None else int(row[0])

    def end_offsets(self, stream: str) -> dict[int, int] | None:
        """Where the newest batch added from ``stream`` ended (by any query id), or None."""
        with self._mutex:
            cursor = self._execute(
                self._cursor(),
                "SELECT end_offsets FROM jobdb_markers WHERE stream = ? AND end_offsets IS NOT "
                "NULL ORDER BY committed_at DESC, batch_id DESC LIMIT 1",
                (stream,),
            )
            row = cursor.fetchone()
            self._connection.commit()
            if row is None:
                return None
            return {int(p): int(o) for p, o in json.loads(row[0]).items()}

    def move_marker(self, query_id: str, batch_id: int) -> None:
        """Raise the marker of ``query_id`` to ``batch_id`` (one transaction; never lowers it)."""
        with self._mutex:
            cursor = self._cursor()
            try:
                self._begin(cursor)
                self._execute(
                    cursor, "SELECT batch_id FROM jobdb_markers WHERE query_id = ?", (query_id,)
                )
                row = cursor.fetchone()
                if row is None:
                    marker = (query_id, batch_id, None, None, time.time())
                    self._execute(cursor, self._upsert_marker(), marker)
                elif int(row[0]) < batch_id:  # its stream and end offsets stay
                    self._execute(
                        cursor,
                        "UPDATE jobdb_markers SET batch_id = ? WHERE query_id = ?",
                        (batch_id, query_id),
                    )
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()


class _Retry(Exception):
    """The dataset to write into was created by someone else meanwhile: read again."""
