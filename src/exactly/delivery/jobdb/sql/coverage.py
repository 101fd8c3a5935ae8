"""What routing has covered, per destination: the spans backfill reads (``jobdb_coverage``).

A destination's live route covers the offsets of its topic from where its stream's routing had
got to when the route started with it; a backfill run covers the offsets it read, for the
events received in its window. Each is one row, written in a transaction that serialises with
the routers' (the newest dataset's row lock), so a backfill never routes what the live route
does, and a rerun never routes what a run before it committed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from exactly.delivery.jobdb.base import BACKFILL, ROUTE, Span
from exactly.delivery.jobdb.sql.schema import SQLSchema

SPAN_COLUMNS = (
    "destination, topic, kind, owner, start_offsets, end_offsets, since_ms, until_ms, updated_at"
)


class Covering(SQLSchema):
    """``open_routes`` (the route query's, at start), ``spans`` (backfill's), and the backfill
    span kept with each chunk's jobs (:meth:`_keep_span`, inside ``add``'s transaction)."""

    def open_routes(self, stream: str, topic: str, destinations: Sequence[str]) -> None:
        """The route query over ``stream`` starts routing ``topic`` to ``destinations``.

        A destination without an open span of this stream gets one, from where the stream's
        newest batch ended: the route goes on from there (a batch planned before and replayed
        adds nothing). One whose span is open and that is no longer routed has it closed there.
        A stream with batches but no span was routed before spans were kept: its destinations
        are taken as routed from the log's start, so backfill never sends what it cannot prove
        was not sent.
        """
        with self._mutex:
            cursor = self._cursor()
            try:
                self._begin(cursor)
                self._lock_newest(cursor)
                self._execute(
                    cursor,
                    "SELECT end_offsets FROM jobdb_markers WHERE stream = ? AND end_offsets IS "
                    "NOT NULL ORDER BY committed_at DESC, batch_id DESC LIMIT 1",
                    (stream,),
                )
                found = cursor.fetchone()
                self._execute(
                    cursor,
                    "SELECT destination, end_offsets FROM jobdb_coverage WHERE kind = ? "
                    "AND owner = ?",
                    (ROUTE, stream),
                )
                rows = cursor.fetchall()
                opened = {str(name) for name, end in rows if end is None}
                since = "{}" if found is None or not rows else str(found[0])
                now = time.time()
                for name in sorted(set(destinations) - opened):
                    self._execute(
                        cursor,
                        f"INSERT INTO jobdb_coverage ({SPAN_COLUMNS}) "
                        "VALUES (?, ?, ?, ?, ?, NULL, NULL, NULL, ?)",
                        (name, topic, ROUTE, stream, since, now),
                    )
                for name in sorted(opened - set(destinations)):
                    self._execute(
                        cursor,
                        "UPDATE jobdb_coverage SET end_offsets = ?, updated_at = ? WHERE "
                        "kind = ? AND owner = ? AND destination = ? AND end_offsets IS NULL",
                        ("{}" if found is None else str(found[0]), now, ROUTE, stream, name),
                    )
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()

    def spans(self, destination: str, topic: str) -> list[Span]:
        """Every span of ``destination`` over ``topic``: routes and backfills, open or not."""
        with self._mutex:
            cursor = self._execute(
                self._cursor(),
                f"SELECT {SPAN_COLUMNS} FROM jobdb_coverage WHERE destination = ? AND topic = ?",
                (destination, topic),
            )
            rows = cursor.fetchall()
            self._connection.commit()
        return [
            Span(
                destination=str(row[0]),
                topic=str(row[1]),
                kind=str(row[2]),
                owner=str(row[3]),
                start=_offsets(row[4]),
                end=None if row[5] is None else _offsets(row[5]),
                since_ms=None if row[6] is None else int(row[6]),
                until_ms=None if row[7] is None else int(row[7]),
            )
            for row in rows
        ]

    def _lock_newest(self, cursor: Any) -> None:
        """Take the newest dataset's row lock: the routers' turn, as ``add`` takes it."""
        self._execute(
            cursor,
            "SELECT number FROM jobdb_datasets "
            f"WHERE number = (SELECT MAX(number) FROM jobdb_datasets){self._for_update}",
        )
        cursor.fetchall()

    def _keep_span(self, cursor: Any, span: Span, now: float) -> None:
        """Write a backfill run's span (its row is the run's: a read, then an insert or an
        update, under the dataset row's lock ``add`` holds)."""
        if span.kind != BACKFILL or span.end is None:
            raise ValueError("only a backfill's closed span is kept with its jobs")
        start, end = _text(span.start), _text(span.end)
        key = (BACKFILL, span.owner, span.destination)
        self._execute(
            cursor,
            "SELECT 1 FROM jobdb_coverage WHERE kind = ? AND owner = ? AND destination = ?",
            key,
        )
        if cursor.fetchone() is None:
            self._execute(
                cursor,
                f"INSERT INTO jobdb_coverage ({SPAN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    span.destination,
                    span.topic,
                    BACKFILL,
                    span.owner,
                    start,
                    end,
                    span.since_ms,
                    span.until_ms,
                    now,
                ),
            )
        else:
            self._execute(
                cursor,
                "UPDATE jobdb_coverage SET end_offsets = ?, updated_at = ? "
                "WHERE kind = ? AND owner = ? AND destination = ?",
                (end, now, *key),
            )


def _offsets(text: Any) -> dict[int, int]:
    return {int(partition): int(offset) for partition, offset in json.loads(str(text)).items()}


def _text(offsets: Mapping[int, int]) -> str:
    return json.dumps({str(p): int(offsets[p]) for p in sorted(offsets)})
