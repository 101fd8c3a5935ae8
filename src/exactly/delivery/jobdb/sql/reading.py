"""The readers' side of the shared SQL: a job's history, counts per destination (``exactly
deliveries``, the console), the jobs of a destination (replay) and of a message (trace)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from exactly.delivery import packs
from exactly.delivery.jobdb.base import (
    ARCHIVED,
    ARCHIVING,
    AWAITING_RETRY,
    AWAITING_SCHEDULING,
    DISCARDED,
    EXPIRED,
    FAILED,
    PENDING,
    SUCCEEDED,
    Job,
    RouteCounts,
    Summary,
    Transition,
    sending,
)
from exactly.delivery.jobdb.sql.controls import Controls
from exactly.delivery.jobdb.sql.rows import JOB_COLUMNS, TRANSITION_COLUMNS, job_of, transition_of

_T = TypeVar("_T")
#: seconds: a dataset whose newest transition is older has had no success in the last minute
#: (transition times follow their ids within seconds; the margin covers that)
RECENT = 120.0


@dataclass
class _Part:
    """What one dataset adds to :meth:`Reading.summary`, and the version it was read at.

    A dataset changes only by jobs added (its row count, written with them) or transitions
    appended (their count: append-only, archiving included; not the newest id, which two
    writers on PostgreSQL or MariaDB may commit out of order), so a part whose version is
    unchanged is still right and its dataset is not scanned again: with a backlog over many
    datasets, a summary reads again the one or two the director and the router are working in,
    and counts the others' transitions from an index, instead of joining every job to its
    latest transition."""

    version: tuple[int, int, int]  # first job id, rows, transitions
    states: dict[str, dict[str, int]] = field(default_factory=dict)
    oldest: dict[str, float] = field(default_factory=dict)  # destination -> oldest pending job
    errors: dict[str, int] = field(default_factory=dict)  # destination -> newest error's id


class Reading(Controls):
    """Reads beside the director, each over the live datasets (archived ones are dropped); a
    summary shows each destination's control (whether it is sending)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._parts: dict[int, _Part] = {}  # each live dataset's part of the last summary

    def history(self, job_id: int) -> list[Transition]:
        """Every transition of ``job_id``, oldest first."""
        with self._mutex:
            cursor = self._cursor()
            number = self._dataset_of(cursor, job_id)
            self._execute(
                cursor,
                f"SELECT {TRANSITION_COLUMNS} FROM job_state_transitions_{number} "
                "WHERE job_id = ? ORDER BY id",
                (job_id,),
            )
            rows = cursor.fetchall()
            self._connection.commit()
            return [transition_of(r) for r in rows]

    def states(self) -> dict[str, dict[str, int]]:
        """Per destination, how many jobs are in each latest state (live datasets only)."""
        return self._while_datasets_stand(self._states)

    def _states(self) -> dict[str, dict[str, int]]:
        with self._mutex:
            cursor = self._cursor()
            counts: dict[str, dict[str, int]] = {}
            for dataset in self._load_datasets(cursor):
                for destination, states in self._state_counts(cursor, dataset.number).items():
                    into = counts.setdefault(destination, {})
                    for state, count in states.items():
                        into[state] = into.get(state, 0) + count
            self._connection.commit()
            return counts

    def _state_counts(self, cursor: Any, n: int) -> dict[str, dict[str, int]]:
        """Dataset ``n``'s jobs per destination and latest state, in events (a pack counts its
        members): a scan of its every job."""
        events = self._events(cursor, n)
        self._execute(
            cursor,
            f"SELECT j.destination, t.state, SUM({events}) FROM jobs_{n} j LEFT JOIN "
            f"job_state_transitions_{n} t ON t.id = (SELECT MAX(id) FROM "
            f"job_state_transitions_{n} WHERE job_id = j.id) GROUP BY j.destination, t.state",
        )
        counts: dict[str, dict[str, int]] = {}
        for destination, state, count in cursor.fetchall():
            into = counts.setdefault(str(destination), {})
            key = AWAITING_SCHEDULING if state is None else str(state)
            into[key] = into.get(key, 0) + int(count)
        return counts

    def summary(self, now: float | None = None) -> dict[str, Summary]:
        """Per destination: jobs per state, the oldest pending job's age and the last error.

        Counts cover the live datasets (archived datasets are dropped, with their counts).
        """
        found = self._while_datasets_stand(lambda: self._summary(now))
        for name, control in self.controls().items():
            if name in found:
                found[name].sending = sending(control)
        return found

    def recent_successes(self, since: float, limit: int) -> list[tuple[float, bytes]]:
        """(time it succeeded, payload) of the newest jobs that succeeded after ``since``."""
        with self._mutex:
            cursor = self._cursor()
            found: list[tuple[float, bytes]] = []
            for dataset in reversed(self._load_datasets(cursor)):
                n = dataset.number
                with self._unless_dropped(cursor, n):
                    self._execute(
                        cursor,
                        f"SELECT t.time, j.payload FROM job_state_transitions_{n} t JOIN "
                        f"jobs_{n} j ON j.id = t.job_id WHERE t.state = ? AND t.time > ? "
                        f"ORDER BY t.id DESC LIMIT {int(limit - len(found))}",
                        (SUCCEEDED, since),
                    )
                    found += [
                        (float(at), one)
                        for at, payload in cursor.fetchall()
                        for one in _payloads(bytes(payload))
                    ]
                if len(found) >= limit:
                    break
            self._connection.commit()
            return found[:limit]

    def _while_datasets_stand(self, read: Callable[[], _T]) -> _T:
        """``read``, again if a dataset it went through was dropped meanwhile.

        A reader beside the director (``exactly deliveries``, ``up``'s view, the console) can
        list the datasets just before the director drops an archived one; its next query then
        finds no table. The list is read again and, if it changed, so is everything else.
        """
        for attempt in range(1, 4):
            try:
                return read()
            except Exception:
                with self._mutex:
                    with contextlib.suppress(Exception):
                        self._connection.rollback()
                    before = [d.number for d in self._datasets]
                    after = [d.number for d in self._load_datasets(self._cursor())]
                    self._connection.commit()
                if before == after or attempt == 3:
                    raise
        raise AssertionError("unreachable")

    def _summary(self, now: float | None) -> dict[str, Summary]:
        """Each live dataset's part, read again only when it changed (see :class:`_Part`)."""
        now = time.time() if now is None else now
        found: dict[str, Summary] = {}
        last: dict[str, tuple[int, int]] = {}  # destination -> (dataset, transition id)
        with self._mutex:
            cursor = self._cursor()
            datasets = self._load_datasets(cursor)
            for dataset in datasets:
                n = dataset.number
                self._execute(cursor, f"SELECT COUNT(*) FROM job_state_transitions_{n}")
                version = (dataset.first_id, dataset.rows, int(cursor.fetchone()[0]))
                self._execute(
                    cursor,
                    f"SELECT time FROM job_state_transitions_{n} ORDER BY id DESC LIMIT 1",
                )
                newest = cursor.fetchone()
                part = self._parts.get(n)
                if part is None or part.version != version:  # read after its version: never older
                    part = self._parts[n] = self._part(cursor, n, version)
                for destination, states in part.states.items():
                    entry = found.setdefault(destination, Summary(destination, {}))
                    for state, count in states.items():
                        entry.states[state] = entry.states.get(state, 0) + count
                for destination, oldest in part.oldest.items():
                    entry = found.setdefault(destination, Summary(destination, {}))
                    age = max(0.0, now - oldest)
                    entry.oldest_pending_seconds = max(entry.oldest_pending_seconds or 0.0, age)
                for destination, step in part.errors.items():
                    last[destination] = (n, step)
                if newest is not None and float(newest[0]) > now - RECENT:
                    self._succeeded_lately(cursor, n, now, found)
            for number in set(self._parts) - {dataset.number for dataset in datasets}:
                del self._parts[number]  # archived and dropped
            for destination, counts in self._route_counts(cursor).items():
                found.setdefault(destination, Summary(destination, {})).withheld = counts
            for destination, (n, step) in last.items():
                self._execute(
                    cursor,
                    "SELECT time, status_code, error_type, response "
                    f"FROM job_state_transitions_{n} WHERE id = ?",
                    (step,),
                )
                at, status, error_type, response = cursor.fetchone()
                what = str(status) if status is not None else str(error_type)
                text = " ".join(str(response or "").split())[:200]
                found[destination].last_error = f"{what}: {text}" if text else what
                found[destination].last_error_at = float(at)
            self._connection.commit()
        return found

    def route_counts(self) -> dict[str, RouteCounts]:
        """Per destination, the events routing (and backfill) chose not to send it."""
        with self._mutex:
            found = self._route_counts(self._cursor())
            self._connection.commit()
            return found

    def _route_counts(self, cursor: Any) -> dict[str, RouteCounts]:
        self._execute(
            cursor,
            "SELECT destination, SUM(filtered), SUM(skipped), SUM(dropped) "
            "FROM jobdb_route_counts GROUP BY destination",
        )
        return {
            str(name): RouteCounts(int(filtered), int(skipped), int(dropped))
            for name, filtered, skipped, dropped in cursor.fetchall()
        }

    def _part(self, cursor: Any, n: int, version: tuple[int, int, int]) -> _Part:
        """Dataset ``n``'s jobs per destination and latest state, its oldest pending job's
        creation and its newest error, per destination: scans of every job of the dataset."""
        part = _Part(version, self._state_counts(cursor, n))
        self._execute(
            cursor,
            f"SELECT j.destination, MIN(j.created_at) FROM jobs_{n} j LEFT JOIN "
            f"job_state_transitions_{n} t ON t.id = (SELECT MAX(id) FROM "
            f"job_state_transitions_{n} WHERE job_id = j.id) WHERE t.state IS NULL OR "
            "t.state IN (?, ?, ?) GROUP BY j.destination",
            PENDING,
        )
        part.oldest = {str(destination): float(oldest) for destination, oldest in cursor}
        self._execute(
            cursor,
            f"SELECT j.destination, MAX(t.id) FROM job_state_transitions_{n} t JOIN "
            f"jobs_{n} j ON j.id = t.job_id WHERE t.state IN (?, ?, ?, ?) AND (t.status_code "
            "IS NOT NULL OR t.error_type IS NOT NULL) GROUP BY j.destination",
            (AWAITING_RETRY, DISCARDED, EXPIRED, FAILED),
        )
        part.errors = {str(destination): int(step) for destination, step in cursor}
        return part

    def _succeeded_lately(self, cursor: Any, n: int, now: float, found: dict[str, Summary]) -> None:
        """Add dataset ``n``'s successes of the last minute to ``found`` (in events)."""
        events = self._events(cursor, n)
        self._execute(
            cursor,
            f"SELECT j.destination, SUM({events}) FROM job_state_transitions_{n} t JOIN "
            f"jobs_{n} j ON j.id = t.job_id WHERE t.state = ? AND t.time > ? AND "
            "t.time <= ? GROUP BY j.destination",
            (SUCCEEDED, now - 60.0, now),
        )
        for destination, count in cursor.fetchall():
            entry = found.setdefault(str(destination), Summary(str(destination), {}))
            entry.succeeded_last_minute += int(count)

    def jobs_of(self, destination: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Jobs of ``destination`` by id above ``after``, with their outcome as ``state``."""
        return self._page(
            after,
            limit,
            " AND state NOT IN (?, ?)",
            (ARCHIVING, ARCHIVED),
            "j.destination = ?",
            (destination,),
        )

    def jobs_with(self, message_id: str) -> list[tuple[Job, list[Transition]]]:
        """Every job of ``message_id`` in the live datasets with its transitions (by the index
        ``jobs_N_message`` of a closed dataset; the newest, which has none yet, is scanned),
        and every pack holding it, as stored (its ``message_id`` is the pack's key): packs are
        found by a scan of their ids, as few rows as a dataset's events over a batch's size."""
        wanted = message_id.encode()
        with self._mutex:
            cursor = self._cursor()
            found: list[tuple[Job, list[Transition]]] = []
            for dataset in self._load_datasets(cursor):
                n = dataset.number
                with self._unless_dropped(cursor, n):
                    self._execute(
                        cursor,
                        f"SELECT {JOB_COLUMNS} FROM jobs_{n} WHERE message_id = ? ORDER BY id",
                        (message_id,),
                    )
                    jobs = [job_of((*row, None, None, None)) for row in cursor.fetchall()]
                    if "events" in self._columns_of(cursor, n):
                        self._execute(
                            cursor,
                            f"SELECT {JOB_COLUMNS} FROM jobs_{n} WHERE message_id LIKE ? "
                            "ORDER BY id",
                            ("pack%",),
                        )
                        jobs += [
                            job
                            for job in (job_of((*row, None, None, None)) for row in cursor)
                            if job.packed
                            and wanted in job.payload
                            and message_id in packs.message_ids(job.payload)
                        ]
                    for job in jobs:
                        self._execute(
                            cursor,
                            f"SELECT {TRANSITION_COLUMNS} FROM job_state_transitions_{n} "
                            "WHERE job_id = ? ORDER BY id",
                            (job.id,),
                        )
                        found.append((job, [transition_of(r) for r in cursor.fetchall()]))
            self._connection.commit()
            return found


def _payloads(payload: bytes) -> list[bytes]:
    """A job's payload, or a pack's members' payloads in its order."""
    return packs.payloads(payload) if packs.is_packed(payload) else [payload]
