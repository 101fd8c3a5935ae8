"""The commit protocol of one micro-batch: its upserts and its marker in one SQL transaction.

Every database keeps ``exactly_batches(query_id, batch_id, checkpoint, topic, end_offsets,
events, committed_at)``: one marker per micro-batch counted, written in the same transaction as
its upserts. The commit protocol of one micro-batch (:meth:`CommitProtocol.commit`), in one SQL
transaction:

1. begin (SQLite: ``BEGIN IMMEDIATE``, the writer lock);
2. look for the marker ``(query id, batch id)``: found means this batch was counted before (Spark
   replays the last batch it did not commit), so roll back and change nothing;
3. upsert every table's rows: ``INSERT ... ON CONFLICT (keys) DO UPDATE SET m = t.m + excluded.m``;
4. insert the marker, with the batch's end offsets in the topic;
5. commit. Only then may Spark commit the batch in its checkpoint.

A crash before 5 leaves nothing; after 5 and before Spark's commit, the replay stops at 2. A lost
connection during 5 leaves the outcome unknown, and the retry settles it at 2. Transient errors
(the server down, the file locked) are retried with backoff for ``retry_seconds``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exactly.aggregate.spec import BATCHES_TABLE, TableSpec
from exactly.aggregate.sql import Row, SQLDatabase, utc_now

KEEP_MARKERS = 1000  # per query: Spark replays only its last batch; older markers are history


@dataclass(frozen=True)
class Batch:
    """One micro-batch's result: rows per table (keys then measures, in the spec's order)."""

    query_id: str
    batch_id: int
    checkpoint: str
    topic: str
    end_offsets: dict[int, int] | None
    rows: dict[str, list[Row]]
    events: int


@dataclass(frozen=True)
class Marker:
    query_id: str
    batch_id: int
    end_offsets: dict[int, int] | None
    events: int
    committed_at: str


class CommitProtocol(SQLDatabase):
    """Counting a micro-batch exactly once, and reading back how far counting got."""

    def commit(self, batch: Batch, specs: Sequence[TableSpec]) -> bool:
        """Count one micro-batch exactly once; False when its marker was there (a replay)."""
        p = self.placeholder

        def work(connection: Any) -> bool:
            cursor = connection.cursor()
            # 1. begin
            self._begin(cursor)
            # 2. the marker: a replayed batch changes nothing
            cursor.execute(
                f"SELECT 1 FROM {BATCHES_TABLE} WHERE query_id = {p} AND batch_id = {p}",
                (batch.query_id, batch.batch_id),
            )
            if cursor.fetchone() is not None:
                connection.rollback()
                return False
            # 3. the upserts
            for spec in specs:
                rows = batch.rows.get(spec.name, [])
                if rows:
                    self._upsert(cursor, spec, self._adapt(spec, rows))
            # 4. the marker, with the position reached in the topic
            offsets = None if batch.end_offsets is None else json.dumps(batch.end_offsets)
            cursor.execute(
                f"INSERT INTO {BATCHES_TABLE} VALUES ({', '.join([p] * 7)})",
                (
                    batch.query_id,
                    batch.batch_id,
                    batch.checkpoint,
                    batch.topic,
                    offsets,
                    batch.events,
                    utc_now(),
                ),
            )
            cursor.execute(
                f"DELETE FROM {BATCHES_TABLE} WHERE query_id = {p} AND batch_id < {p}",
                (batch.query_id, batch.batch_id - KEEP_MARKERS),
            )
            # 5. commit: durable before Spark may commit the batch
            connection.commit()
            return True

        return self._retrying(work)

    def latest_marker(
        self, checkpoint: str | None = None, topic: str | None = None
    ) -> Marker | None:
        """The newest batch counted (by this checkpoint and topic when given)."""
        p = self.placeholder
        where, args = [], []
        if checkpoint is not None:
            where.append(f"checkpoint = {p}")
            args.append(checkpoint)
        if topic is not None:
            where.append(f"topic = {p}")
            args.append(topic)
        clause = f"WHERE {' AND '.join(where)}" if where else ""

        def work(connection: Any) -> Marker | None:
            cursor = connection.cursor()
            if self._existing_columns(cursor, BATCHES_TABLE) is None:
                connection.rollback()
                return None
            cursor.execute(
                f"SELECT query_id, batch_id, end_offsets, events, committed_at FROM "
                f"{BATCHES_TABLE} {clause} ORDER BY committed_at DESC, batch_id DESC LIMIT 1",
                args,
            )
            found = cursor.fetchone()
            connection.rollback()
            if found is None:
                return None
            offsets = None if found[2] is None else json.loads(found[2])
            return Marker(
                found[0],
                int(found[1]),
                None if offsets is None else {int(k): int(v) for k, v in offsets.items()},
                int(found[3]),
                str(found[4]),
            )

        return self._retrying(work, min(self.retry_seconds, 30.0))

    def markers(self, topic: str) -> list[Marker]:
        """Every marker kept for ``topic`` (the last :data:`KEEP_MARKERS` per query), by query
        and batch: which micro-batch counted an offset (``exactly trace``)."""
        p = self.placeholder

        def work(connection: Any) -> list[Marker]:
            cursor = connection.cursor()
            if self._existing_columns(cursor, BATCHES_TABLE) is None:
                connection.rollback()
                return []
            cursor.execute(
                f"SELECT query_id, batch_id, end_offsets, events, committed_at FROM "
                f"{BATCHES_TABLE} WHERE topic = {p} ORDER BY query_id, batch_id",
                (topic,),
            )
            rows = cursor.fetchall()
            connection.rollback()
            found = []
            for query_id, batch_id, offsets, events, committed_at in rows:
                ends = None if offsets is None else json.loads(offsets)
                found.append(
                    Marker(
                        str(query_id),
                        int(batch_id),
                        None if ends is None else {int(k): int(v) for k, v in ends.items()},
                        int(events),
                        str(committed_at),
                    )
                )
            return found

        return self._retrying(work, min(self.retry_seconds, 30.0))
