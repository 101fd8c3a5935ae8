"""The JobDB's SQL, written once for every backend (see :mod:`exactly.delivery.base`).

A backend subclasses :class:`SQLJobDB` and gives a DB-API connection (``_connect``), how to start a
write transaction (``_begin``), its placeholder (``_sql``), its column types, its marker upsert and
the director's lock. Tables: ``jobdb_datasets`` and ``jobdb_markers``, then per dataset N
``jobs_N`` and ``job_state_transitions_N``. One connection per JobDB, used under a mutex.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from exactly.delivery.base import (
    ARCHIVED,
    ARCHIVING,
    AWAITING_RETRY,
    AWAITING_SCHEDULING,
    DISCARDED,
    EXPIRED,
    MAX_RESPONSE,
    PENDING,
    STATES,
    SUCCEEDED,
    Dataset,
    Job,
    JobDB,
    JobDBError,
    NewJob,
    Summary,
    Transition,
)

RECORD_PAGE = 2000  # jobs read at once when a dataset is archived
_JOB_COLUMNS = ", ".join(
    [
        "id",
        "bucket",
        "destination",
        "payload",
        "message_id",
        "user_id",
        "created_at",
        "expire_at",
    ]
)

MARKER_COLUMNS = "query_id, batch_id, stream, end_offsets, committed_at"

_T = TypeVar("_T")


class SQLJobDB(JobDB):
    """The JobDB in SQL, for every backend: they give a connection, a dialect and a lock."""

    scheme: ClassVar[str]
    #: SQL types: ``id`` (64-bit int), ``serial`` (auto-increment primary key), ``text`` (short,
    #: indexable), ``body`` (long text), ``blob``, ``real``
    types: ClassVar[dict[str, str]]
    #: indexes declared inside CREATE TABLE (MariaDB, where each DDL statement commits)
    inline_indexes: ClassVar[bool] = False

    def __init__(
        self, url: str, *, dataset_rows: int = 100_000, dataset_minutes: float = 60.0
    ) -> None:
        self.url = url
        self.dataset_rows = dataset_rows
        self.dataset_minutes = dataset_minutes
        self._connection: Any = None
        self._datasets: list[Dataset] = []
        self._closed_buckets: dict[int, set[str]] = {}  # dataset -> its buckets, once not newest
        self._legacy: dict[int, bool] = {}  # dataset -> whether its jobs table has credentials
        self._mutex = threading.RLock()  # one connection, used from one thread at a time

    # -- what a backend provides ---------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any:
        """A new DB-API connection, outside autocommit."""

    @abstractmethod
    def _begin(self, cursor: Any) -> None:
        """Start a write transaction (SQLite takes its write lock here)."""

    @abstractmethod
    def _upsert_marker(self) -> str:
        """SQL setting the marker of ``query_id``: ``?`` for query id, batch id, stream, end
        offsets and commit time, in the order of :data:`MARKER_COLUMNS`."""

    def _sql(self, text: str) -> str:
        """``text`` with the backend's placeholder for ``?``."""
        return text

    _for_update = " FOR UPDATE"

    # -- connection ----------------------------------------------------------------------------

    def close(self) -> None:
        with self._mutex:
            if self._connection is not None:
                try:
                    self._connection.close()
                finally:
                    self._connection = None

    def _cursor(self) -> Any:
        if self._connection is None:
            self._connection = self._connect()
            self._create_schema()
        return self._connection.cursor()

    def _execute(self, cursor: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cursor.execute(self._sql(sql), tuple(params))
        return cursor

    def _create_schema(self) -> None:
        t = self.types
        cursor = self._connection.cursor()
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobdb_datasets (number {t['id']} PRIMARY KEY, "
            f"first_id {t['id']} NOT NULL, n_rows {t['id']} NOT NULL, created_at {t['real']} "
            "NOT NULL)",
        )
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobdb_markers (query_id {t['text']} PRIMARY KEY, "
            f"batch_id {t['id']} NOT NULL, stream {t['body']}, end_offsets {t['body']}, "
            f"committed_at {t['real']})",
        )
        self._connection.commit()
        self._add_marker_columns(cursor)
        if not self._load_datasets(cursor):
            self._create_dataset(cursor, 1)
            try:
                self._begin(cursor)
                self._execute(cursor, "SELECT COUNT(*) FROM jobdb_datasets")
                if int(cursor.fetchone()[0]) == 0:
                    self._execute(
                        cursor,
                        "INSERT INTO jobdb_datasets (number, first_id, n_rows, created_at) "
                        "VALUES (?, ?, ?, ?)",
                        (1, 1, 0, time.time()),
                    )
                self._connection.commit()
            except Exception:  # noqa: BLE001 (another process created it first)
                self._connection.rollback()
            self._load_datasets(cursor)

    def _add_marker_columns(self, cursor: Any) -> None:
        """Give a JobDB made before markers kept their position the columns for it."""
        try:
            self._execute(cursor, "SELECT stream FROM jobdb_markers WHERE 1 = 0")
            cursor.fetchall()
            self._connection.commit()
            return
        except Exception:  # noqa: BLE001 (no such column, in each dialect's words)
            self._connection.rollback()
        t = self.types
        for column, kind in (("stream", "body"), ("end_offsets", "body"), ("committed_at", "real")):
            self._execute(cursor, f"ALTER TABLE jobdb_markers ADD COLUMN {column} {t[kind]}")
        self._connection.commit()

    def _create_dataset(self, cursor: Any, number: int) -> None:
        """Create dataset ``number``'s tables, before the transaction that registers it.

        SQLite and PostgreSQL create both tables with their indexes in one transaction;
        MariaDB commits on DDL, so there each table is one statement with its index inline.
        Either way a table exists whole or not at all (:meth:`drop_orphans` may drop them
        meanwhile: the registering transaction checks that both exist, or starts again).
        """
        t = self.types
        n = number
        inline = self.inline_indexes
        self._begin(cursor)
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobs_{n} (id {t['id']} PRIMARY KEY, "
            f"bucket {t['text']} NOT NULL, destination {t['text']} NOT NULL, "
            f"payload {t['blob']} NOT NULL, message_id "
            f"{t['text']} NOT NULL, user_id {t['text']}, created_at {t['real']} NOT NULL, "
            f"expire_at {t['real']} NOT NULL"
            + (
                f", INDEX jobs_{n}_bucket (bucket, id), INDEX jobs_{n}_message (message_id))"
                if inline
                else ")"
            ),
        )
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS job_state_transitions_{n} (id {t['serial']}, "
            f"job_id {t['id']} NOT NULL, time {t['real']} NOT NULL, attempt {t['id']} NOT NULL, "
            f"state {t['text']} NOT NULL, retry_at {t['real']}, status_code {t['id']}, "
            f"error_type {t['text']}, response {t['body']}"
            + (f", INDEX job_state_transitions_{n}_job (job_id, id))" if inline else ")"),
        )
        if not inline:
            self._execute(
                cursor, f"CREATE INDEX IF NOT EXISTS jobs_{n}_bucket ON jobs_{n} (bucket, id)"
            )
            self._execute(
                cursor,
                f"CREATE INDEX IF NOT EXISTS jobs_{n}_message ON jobs_{n} (message_id)",
            )
            self._execute(
                cursor,
                f"CREATE INDEX IF NOT EXISTS job_state_transitions_{n}_job "
                f"ON job_state_transitions_{n} (job_id, id)",
            )
        self._connection.commit()

    def _load_datasets(self, cursor: Any) -> list[Dataset]:
        self._execute(
            cursor,
            "SELECT number, first_id, n_rows, created_at FROM jobdb_datasets ORDER BY number",
        )
        self._datasets = [Dataset(int(a), int(b), int(c), float(d)) for a, b, c, d in cursor]
        self._connection.commit()
        return self._datasets

    # -- the router's side ---------------------------------------------------------------------

    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        stream: str | None = None,
        end_offsets: Mapping[int, int] | None = None,
    ) -> int:
        """Add a micro-batch's jobs with its marker in one transaction; how many were added.

        1. lock the newest dataset's row (the router's turn);
        2. read the marker: a batch id not above it was committed before, so add nothing;
        3. insert the jobs into the newest dataset, or into a new one when it is full or old;
        4. move the marker to ``batch_id``, with ``stream`` and ``end_offsets``; commit.
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
                if self._legacy_dataset(cursor, newest.number) or self._full(newest, len(jobs)):
                    try:
                        self._create_dataset(cursor, newest.number + 1)  # DDL before the txn
                    except Exception:  # tables dropped half made by drop_orphans: make them again
                        self._connection.rollback()
                        failures += 1
                        if failures > 5:
                            raise
                        self._load_datasets(cursor)
                        continue
                try:
                    added = self._add(cursor, jobs, marker)
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

    def _legacy_dataset(self, cursor: Any, number: int) -> bool:
        """Whether dataset ``number``'s jobs table was made by a JobDB that stored each job's
        endpoint and headers (NOT NULL columns, which today's jobs leave empty): such a dataset
        takes no new jobs, ``add`` opens the next one. Its columns are read once per dataset;
        reads name their columns, so its jobs are delivered and archived without them."""
        known = self._legacy.get(number)
        if known is None:
            try:
                self._execute(cursor, f"SELECT * FROM jobs_{number} WHERE 1 = 0")
                cursor.fetchall()
                columns = {str(column[0]).lower() for column in cursor.description}
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()
            known = self._legacy[number] = "endpoint" in columns or "headers" in columns
        return known

    def _add(
        self, cursor: Any, jobs: Sequence[NewJob], marker: tuple[str, int, str | None, str | None]
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
        # 3. the jobs
        now = time.time()
        target = newest
        if newest.number not in self._legacy:  # made by another router meanwhile: check it
            raise _Retry
        if self._legacy[newest.number] or self._full(newest, len(jobs)):
            target = Dataset(newest.number + 1, newest.first_id + newest.rows, 0, now)
            if not self._dataset_exists(cursor, target.number):
                raise _Retry
            self._execute(
                cursor,
                "INSERT INTO jobdb_datasets (number, first_id, n_rows, created_at) "
                "VALUES (?, ?, ?, ?)",
                (target.number, target.first_id, 0, now),
            )
        rows_ = [
            (
                target.first_id + target.rows + i,
                job.bucket,
                job.destination,
                job.payload,
                job.message_id,
                job.user_id,
                now,
                job.expire_at or now + 4 * 3600,
            )
            for i, job in enumerate(jobs)
        ]
        if rows_:
            cursor.executemany(
                self._sql(
                    f"INSERT INTO jobs_{target.number} ({_JOB_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                rows_,
            )
        self._execute(
            cursor,
            "UPDATE jobdb_datasets SET n_rows = ? WHERE number = ?",
            (target.rows + len(jobs), target.number),
        )
        # 4. the marker
        self._execute(cursor, self._upsert_marker(), (*marker, now))
        return len(jobs)

    @contextlib.contextmanager
    def _unless_dropped(self, cursor: Any, number: int) -> Iterator[None]:
        """Reads of dataset ``number``; their failure is passed over if the dataset was dropped
        meanwhile (archived: nothing of it is pending or to trace any more), else raised."""
        try:
            yield
        except Exception:
            self._connection.rollback()
            if self._dataset_exists(cursor, number):
                self._connection.rollback()
                raise
            self._connection.rollback()

    def _dataset_exists(self, cursor: Any, number: int) -> bool:
        """Whether both of dataset ``number``'s tables exist (in a transaction, the locks taken
        keep them until commit)."""
        try:
            self._execute(cursor, f"SELECT 1 FROM jobs_{number} WHERE id = -1")
            cursor.fetchall()
            self._execute(cursor, f"SELECT 1 FROM job_state_transitions_{number} WHERE id = -1")
            cursor.fetchall()
            return True
        except Exception:  # noqa: BLE001 (no such table, in each dialect's words)
            return False

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

    # -- the director's side -------------------------------------------------------------------

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

    def _page(
        self,
        after: int,
        limit: int,
        latest: str,
        latest_args: tuple[Any, ...],
        where: str,
        where_args: tuple[Any, ...],
    ) -> list[Job]:
        """Up to ``limit`` jobs by id with ids above ``after``, over the live datasets, each with
        its newest transition that SQL condition ``latest`` admits, kept where ``where`` holds.

        A dataset dropped meanwhile (archived) is passed over.
        """
        with self._mutex:
            cursor = self._cursor()
            found: list[Job] = []
            for dataset in self._load_datasets(cursor):
                if dataset.first_id + dataset.rows <= after + 1 or len(found) >= limit:
                    continue
                n = dataset.number
                with self._unless_dropped(cursor, n):
                    self._execute(
                        cursor,
                        f"SELECT j.id, j.bucket, j.destination, j.payload, "
                        f"j.message_id, j.user_id, j.created_at, j.expire_at, t.state, t.attempt, "
                        f"t.retry_at FROM jobs_{n} j LEFT JOIN job_state_transitions_{n} t ON "
                        f"t.id = (SELECT MAX(id) FROM job_state_transitions_{n} WHERE job_id = "
                        f"j.id{latest}) WHERE {where} AND j.id > ? ORDER BY j.id LIMIT ?",
                        (*latest_args, *where_args, after, limit - len(found)),
                    )
                    found.extend(_job(row) for row in cursor.fetchall())
            self._connection.commit()
            return found

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

    def record(self, transitions: Sequence[Transition]) -> None:
        """Append ``transitions`` in one transaction, durable on return (the director's write)."""
        if not transitions:
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

    def _dataset_of(self, cursor: Any, job_id: int) -> int:
        for dataset in self._datasets:
            if dataset.holds(job_id):
                return dataset.number
        for dataset in self._load_datasets(cursor):
            if dataset.holds(job_id):
                return dataset.number
        raise JobDBError(f"job {job_id} is in no live dataset of {self.describe()}")

    def history(self, job_id: int) -> list[Transition]:
        """Every transition of ``job_id``, oldest first."""
        with self._mutex:
            cursor = self._cursor()
            number = self._dataset_of(cursor, job_id)
            self._execute(
                cursor,
                "SELECT job_id, state, attempt, time, retry_at, status_code, error_type, response "
                f"FROM job_state_transitions_{number} WHERE job_id = ? ORDER BY id",
                (job_id,),
            )
            rows = cursor.fetchall()
            self._connection.commit()
            return [
                Transition(
                    int(r[0]),
                    str(r[1]),
                    int(r[2]),
                    float(r[3]),
                    None if r[4] is None else float(r[4]),
                    None if r[5] is None else int(r[5]),
                    r[6],
                    r[7],
                )
                for r in rows
            ]

    def datasets(self) -> list[Dataset]:
        with self._mutex:
            return list(self._load_datasets(self._cursor()))

    def states(self) -> dict[str, dict[str, int]]:
        """Per destination, how many jobs are in each latest state (live datasets only)."""
        return self._while_datasets_stand(self._states)

    def _states(self) -> dict[str, dict[str, int]]:
        with self._mutex:
            cursor = self._cursor()
            counts: dict[str, dict[str, int]] = {}
            for dataset in self._load_datasets(cursor):
                n = dataset.number
                self._execute(
                    cursor,
                    f"SELECT j.destination, t.state, COUNT(*) FROM jobs_{n} j LEFT JOIN "
                    f"job_state_transitions_{n} t ON t.id = (SELECT MAX(id) FROM "
                    f"job_state_transitions_{n} WHERE job_id = j.id) GROUP BY j.destination, "
                    "t.state",
                )
                for destination, state, count in cursor.fetchall():
                    into = counts.setdefault(str(destination), {})
                    key = AWAITING_SCHEDULING if state is None else str(state)
                    into[key] = into.get(key, 0) + int(count)
            self._connection.commit()
            return counts

    def summary(self, now: float | None = None) -> dict[str, Summary]:
        """Per destination: jobs per state, the oldest pending job's age and the last error.

        Counts cover the live datasets (archived datasets are dropped, with their counts).
        """
        return self._while_datasets_stand(lambda: self._summary(now))

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
        now = time.time() if now is None else now
        found: dict[str, Summary] = {}
        for destination, states in self.states().items():
            found[destination] = Summary(destination, dict(states))
        with self._mutex:
            cursor = self._cursor()
            last: dict[str, tuple[int, int]] = {}  # destination -> (dataset, transition id)
            for dataset in self._datasets:
                n = dataset.number
                self._execute(
                    cursor,
                    f"SELECT j.destination, MIN(j.created_at) FROM jobs_{n} j LEFT JOIN "
                    f"job_state_transitions_{n} t ON t.id = (SELECT MAX(id) FROM "
                    f"job_state_transitions_{n} WHERE job_id = j.id) WHERE t.state IS NULL OR "
                    "t.state IN (?, ?, ?) GROUP BY j.destination",
                    PENDING,
                )
                for destination, oldest in cursor.fetchall():
                    entry = found.setdefault(str(destination), Summary(str(destination), {}))
                    age = max(0.0, now - float(oldest))
                    entry.oldest_pending_seconds = max(entry.oldest_pending_seconds or 0.0, age)
                self._execute(
                    cursor,
                    f"SELECT j.destination, MAX(t.id) FROM job_state_transitions_{n} t JOIN "
                    f"jobs_{n} j ON j.id = t.job_id WHERE t.state IN (?, ?, ?) AND (t.status_code "
                    "IS NOT NULL OR t.error_type IS NOT NULL) GROUP BY j.destination",
                    (AWAITING_RETRY, DISCARDED, EXPIRED),
                )
                for destination, step in cursor.fetchall():
                    last[str(destination)] = (n, int(step))
                self._execute(
                    cursor,
                    f"SELECT j.destination, COUNT(*) FROM job_state_transitions_{n} t JOIN "
                    f"jobs_{n} j ON j.id = t.job_id WHERE t.state = ? AND t.time > ? AND "
                    "t.time <= ? GROUP BY j.destination",
                    (SUCCEEDED, now - 60.0, now),
                )
                for destination, count in cursor.fetchall():
                    entry = found.setdefault(str(destination), Summary(str(destination), {}))
                    entry.succeeded_last_minute += int(count)
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

    # -- archiving and dropping datasets -------------------------------------------------------

    def archivable(self) -> list[int]:
        """Closed datasets (not the newest) whose jobs are all terminal, archiving or archived."""
        with self._mutex:
            cursor = self._cursor()
            ready: list[int] = []
            for dataset in self._load_datasets(cursor)[:-1]:
                n = dataset.number
                self._execute(
                    cursor,
                    f"SELECT COUNT(*) FROM jobs_{n} j LEFT JOIN job_state_transitions_{n} t ON "
                    f"t.id = (SELECT MAX(id) FROM job_state_transitions_{n} WHERE job_id = j.id) "
                    "WHERE t.state IS NULL OR t.state IN (?, ?, ?)",
                    PENDING,
                )
                if int(cursor.fetchone()[0]) == 0:
                    ready.append(n)
            self._connection.commit()
            return ready

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
        4. ``DROP TABLE`` both tables and forget the dataset.

        A dataset found all ``archived`` (a crash between steps 3 and 4) goes straight to step 4:
        its file was complete before step 3, and writing it again would add ``archived`` to it.
        """
        if number not in self.archivable():
            raise JobDBError(f"dataset {number} still has pending jobs or is the newest")
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
                f"SELECT {_JOB_COLUMNS} FROM jobs_{number} WHERE id > ? ORDER BY id LIMIT ?",
                (after, RECORD_PAGE),
            )
            jobs = [_job((*row, None, None, None)) for row in cursor.fetchall()]
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
                yield {
                    "id": job.id,
                    "bucket": job.bucket,
                    "destination": job.destination,
                    "payload": job.payload.decode("utf-8", "replace"),
                    "message_id": job.message_id,
                    "user_id": job.user_id,
                    "created_at": job.created_at,
                    "expire_at": job.expire_at,
                    "transitions": steps.get(job.id, []),
                }

    # -- tables no dataset lists ----------------------------------------------------------------

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

    @abstractmethod
    def _list_tables(self) -> str:
        """SQL listing the names of the tables in this JobDB's database (or schema)."""

    def _lock_datasets(self, cursor: Any, tables: Sequence[str]) -> None:
        """Begin a transaction routers wait for (SQLite: its write lock, ``BEGIN IMMEDIATE``)."""
        self._begin(cursor)

    def _unlock_datasets(self, cursor: Any) -> None:
        self._connection.commit()

    # -- replay ----------------------------------------------------------------------------------

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
        ``jobs_N_message``; a dataset created before that index is scanned)."""
        with self._mutex:
            cursor = self._cursor()
            found: list[tuple[Job, list[Transition]]] = []
            for dataset in self._load_datasets(cursor):
                n = dataset.number
                with self._unless_dropped(cursor, n):
                    self._execute(
                        cursor,
                        f"SELECT {_JOB_COLUMNS} FROM jobs_{n} WHERE message_id = ? ORDER BY id",
                        (message_id,),
                    )
                    jobs = [_job((*row, None, None, None)) for row in cursor.fetchall()]
                    for job in jobs:
                        self._execute(
                            cursor,
                            "SELECT job_id, state, attempt, time, retry_at, status_code, "
                            f"error_type, response FROM job_state_transitions_{n} "
                            "WHERE job_id = ? ORDER BY id",
                            (job.id,),
                        )
                        found.append((job, [_transition(r) for r in cursor.fetchall()]))
            self._connection.commit()
            return found

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


def _transition(r: Sequence[Any]) -> Transition:
    return Transition(
        int(r[0]),
        str(r[1]),
        int(r[2]),
        float(r[3]),
        None if r[4] is None else float(r[4]),
        None if r[5] is None else int(r[5]),
        r[6],
        r[7],
    )


def _job(row: Sequence[Any]) -> Job:
    """A job from :data:`_JOB_COLUMNS` followed by its latest state, attempt and retry time."""
    return Job(
        id=int(row[0]),
        bucket=str(row[1]),
        destination=str(row[2]),
        payload=bytes(row[3]),
        message_id=str(row[4]),
        user_id=None if row[5] is None else str(row[5]),
        created_at=float(row[6]),
        expire_at=float(row[7]),
        state=AWAITING_SCHEDULING if row[8] is None else str(row[8]),
        attempt=0 if row[9] is None else int(row[9]),
        retry_at=None if row[10] is None else float(row[10]),
    )
