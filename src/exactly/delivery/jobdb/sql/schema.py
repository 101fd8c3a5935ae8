"""The shared SQL's ground: what a backend provides, the connection, the tables and datasets.

:class:`SQLSchema` is the base of the other modules of this package (one per side of the JobDB)
and of :class:`~exactly.delivery.jobdb.sql.SQLJobDB`, which composes them. A backend gives a
DB-API connection (``_connect``), how to start a write transaction (``_begin``), its placeholder
(``_sql``), its column types, its marker upsert, how to list and lock tables, and the director's
lock. Tables: ``jobdb_datasets``, ``jobdb_markers``, ``jobdb_coverage``, ``jobdb_batches`` and
``jobdb_batch_steps``, then per dataset N ``jobs_N`` and ``job_state_transitions_N``. One
connection per JobDB, used under a mutex.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from itertools import chain, repeat
from typing import Any, ClassVar, Self

from exactly.delivery.jobdb.base import Dataset, Job
from exactly.delivery.jobdb.sql.rows import JOB_COLUMNS, job_of, statement_spans
from exactly.errors import JobDBError

MARKER_COLUMNS = "query_id, batch_id, stream, end_offsets, committed_at"
JOINED_COLUMNS = ", ".join(f"j.{column}" for column in JOB_COLUMNS.split(", "))
SCHEMA_ATTEMPTS = 8  # passes at creating the JobDB's tables while others create them too


class SQLSchema(ABC):
    """The JobDB in SQL, for every backend: they give a connection, a dialect and their locks
    (the abstract methods below are all a backend must write)."""

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
        self._legacy: dict[int, bool] = {}  # dataset -> whether it was made by an older JobDB
        self._columns: dict[int, set[str]] = {}  # dataset -> its jobs table's columns
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
    _insert_rows = 1000  # rows an insert statement carries at most (9,000 parameters for jobs)

    @abstractmethod
    def _list_tables(self) -> str:
        """SQL listing the names of the tables in this JobDB's database (or schema)."""

    def _lock_datasets(self, cursor: Any, tables: Sequence[str]) -> None:
        """Begin a transaction routers wait for (SQLite: its write lock, ``BEGIN IMMEDIATE``)."""
        self._begin(cursor)

    def _unlock_datasets(self, cursor: Any) -> None:
        self._connection.commit()

    @abstractmethod
    def director_lock(self, *, wait: bool = True) -> AbstractContextManager[None]:
        """Hold the director's lock while inside; wait for it, or raise DirectorLockHeld."""

    def keep_lock(self) -> None:  # noqa: B027 (a lock that cannot be lost needs nothing)
        """Check the director lock is still held, taking it again if the connection that held
        it was lost (a restarted server, a terminated backend); raise DirectorLockHeld if another
        director took it meanwhile. A lock that cannot be lost (SQLite's flock) has nothing to
        check."""

    @abstractmethod
    def replay_lock(self, destination: str, kind: str = "replay") -> AbstractContextManager[None]:
        """Hold ``destination``'s lock of ``kind`` (``replay``, ``backfill``) while inside, or
        raise ReplayRunning at once; the database or the kernel releases it when its holder
        dies, however it dies."""

    # -- connection ----------------------------------------------------------------------------

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        from exactly.urls import redact

        return redact(self.url)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        with self._mutex:
            if self._connection is not None:
                try:
                    self._connection.close()
                finally:
                    self._connection = None

    def _cursor(self) -> Any:
        if self._connection is None:
            self._connection = self._connect()
            self._create_schema_once()
            self._connected()
        return self._connection.cursor()

    def _connected(self) -> None:  # noqa: B027 (nothing to do unless leases are held)
        """After a new connection is made (leases are taken again on it: ``leasing.py``)."""

    def _execute(self, cursor: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        cursor.execute(self._sql(sql), tuple(params))
        return cursor

    def _insert(self, cursor: Any, table: str, rows: Sequence[tuple[Any, ...]], big: int) -> None:
        """``rows`` into ``table`` (its name and columns) in the open transaction, many rows a
        statement (as many as ``_insert_rows`` and :data:`STATEMENT_BYTES` of their values at
        index ``big`` allow). ``executemany`` costs the driver a step a row, and SQLite's driver
        gives up the GIL around each step, which another busy thread of the process (the
        director's event loop, the pipeline driver's other queries) can then hold for up to a
        switch interval before the step's thread gets it back."""
        if not rows:
            return
        marks = "(" + ", ".join("?" * len(rows[0])) + ")"
        sizes = [len(row[big] or b"") for row in rows]
        for span in statement_spans(sizes, self._insert_rows):
            chunk = rows[span.start : span.stop]
            cursor.execute(
                self._sql(f"INSERT INTO {table} VALUES {', '.join(repeat(marks, len(chunk)))}"),
                list(chain.from_iterable(chunk)),
            )

    def tables(self) -> list[str]:
        """The names of the tables in this JobDB's database (or schema), on a connection of its
        own, creating none: a look that changes nothing (``exactly doctor``)."""
        connection = self._connect()
        try:
            cursor = connection.cursor()
            cursor.execute(self._list_tables())
            return sorted(str(row[0]) for row in cursor.fetchall())
        finally:
            connection.close()

    # -- tables and datasets -------------------------------------------------------------------

    def _create_table(self, cursor: Any, table: str, statement: str) -> None:
        """Run ``statement``, a ``CREATE TABLE IF NOT EXISTS`` of ``table``, and commit.

        Two processes creating the same table at once (directors starting together) can make
        PostgreSQL fail one of them with a unique violation in its catalog, IF NOT EXISTS
        notwithstanding: that one finds the table made by the other and goes on."""
        try:
            self._execute(cursor, statement)
            self._connection.commit()
        except Exception:
            self._connection.rollback()
            try:
                self._execute(cursor, f"SELECT 1 FROM {table} WHERE 1 = 0")
                cursor.fetchall()
                self._connection.commit()
            except Exception:  # noqa: BLE001 - not made by another: the first error stands
                self._connection.rollback()
            else:
                return
            raise

    def _create_schema_once(self) -> None:
        """:meth:`_create_schema`, again after a failure: processes opening a new JobDB
        together (``exactly up`` starting the route query and its directors) race to create
        the same tables, and PostgreSQL fails all but one of concurrent ``CREATE TABLE IF NOT
        EXISTS`` with a unique violation in its catalog; every statement is idempotent, so the
        next pass finds the tables the winner made. Each pass may lose on another table (eight
        processes, seven tables), so it tries up to eight times, at jittered intervals."""
        for attempt in range(1, SCHEMA_ATTEMPTS + 1):
            try:
                self._create_schema()
                return
            except Exception:
                self._connection.rollback()
                if attempt == SCHEMA_ATTEMPTS:
                    raise
                time.sleep(random.uniform(0.02, 0.05 * attempt))

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
        self._execute(
            cursor,
            "CREATE TABLE IF NOT EXISTS jobdb_route_counts (destination "
            f"{t['text']} NOT NULL, origin {t['text']} NOT NULL, filtered {t['id']} NOT NULL, "
            f"skipped {t['id']} NOT NULL, dropped {t['id']} NOT NULL, updated_at {t['real']} "
            "NOT NULL, PRIMARY KEY (destination, origin))",
        )
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobdb_coverage (destination {t['text']} NOT NULL, "
            f"topic {t['text']} NOT NULL, kind {t['text']} NOT NULL, owner {t['body']} NOT NULL, "
            f"start_offsets {t['body']} NOT NULL, end_offsets {t['body']}, since_ms {t['id']}, "
            f"until_ms {t['id']}, updated_at {t['real']} NOT NULL)",
        )
        self._connection.commit()
        self._create_batch_tables(cursor)
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

    def _create_batch_tables(self, cursor: Any) -> None:
        """``jobdb_batches`` (a row per batch: its bucket, destination and members) and
        ``jobdb_batch_steps`` (its attempts). Beside the datasets rather than in them: a batch's
        members may span two datasets; its rows go when the last of them is dropped."""
        t = self.types
        inline = self.inline_indexes
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobdb_batches (id {t['text']} PRIMARY KEY, "
            f"bucket {t['text']} NOT NULL, destination {t['text']} NOT NULL, "
            f"first_job {t['id']} NOT NULL, last_job {t['id']} NOT NULL, "
            f"job_ids {t['body']} NOT NULL, created_at {t['real']} NOT NULL"
            + (", INDEX jobdb_batches_bucket (bucket, first_job))" if inline else ")"),
        )
        self._execute(
            cursor,
            f"CREATE TABLE IF NOT EXISTS jobdb_batch_steps (id {t['serial']}, "
            f"batch_id {t['text']} NOT NULL, time {t['real']} NOT NULL, attempt {t['id']} "
            f"NOT NULL, state {t['text']} NOT NULL, retry_at {t['real']}, status_code {t['id']}, "
            f"error_type {t['text']}, response {t['body']}"
            + (", INDEX jobdb_batch_steps_batch (batch_id, id))" if inline else ")"),
        )
        if not inline:
            self._execute(
                cursor,
                "CREATE INDEX IF NOT EXISTS jobdb_batches_bucket ON jobdb_batches "
                "(bucket, first_job)",
            )
            self._execute(
                cursor,
                "CREATE INDEX IF NOT EXISTS jobdb_batch_steps_batch ON jobdb_batch_steps "
                "(batch_id, id)",
            )
        self._connection.commit()

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
        The index by message id comes when the dataset closes (:meth:`_index_messages`).
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
            f"expire_at {t['real']} NOT NULL, events {t['id']} NOT NULL DEFAULT 1"
            + (f", INDEX jobs_{n}_bucket (bucket, id))" if inline else ")"),
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
                f"CREATE INDEX IF NOT EXISTS job_state_transitions_{n}_job "
                f"ON job_state_transitions_{n} (job_id, id)",
            )
        self._connection.commit()

    def _index_messages(self, cursor: Any, number: int) -> None:
        """Index dataset ``number``'s jobs by message id (for ``exactly trace``), as it closes.

        Kept up row by row, this index was a quarter of the router's insert: message ids arrive
        in no order, so each row lands on a random page of it. Built once over a closed
        dataset, it is one sort. The newest dataset has none, and ``trace`` scans it.
        """
        n = number
        index = f"CREATE INDEX IF NOT EXISTS jobs_{n}_message ON jobs_{n} (message_id)"
        self._execute(cursor, index)
        self._connection.commit()

    def _load_datasets(self, cursor: Any) -> list[Dataset]:
        self._execute(
            cursor,
            "SELECT number, first_id, n_rows, created_at FROM jobdb_datasets ORDER BY number",
        )
        self._datasets = [Dataset(int(a), int(b), int(c), float(d)) for a, b, c, d in cursor]
        self._connection.commit()
        return self._datasets

    def _legacy_dataset(self, cursor: Any, number: int) -> bool:
        """Whether dataset ``number``'s jobs table was made by an older JobDB: one that stored
        each job's endpoint and headers (NOT NULL columns, which today's jobs leave empty), or
        one without the ``events`` column a pack needs (:mod:`exactly.delivery.packs`). Such a
        dataset takes no new jobs, ``add`` opens the next one. Its columns are read once per
        dataset; reads name their columns, so its jobs are delivered and archived as they
        are."""
        known = self._legacy.get(number)
        if known is None:
            columns = self._columns_of(cursor, number)
            known = "endpoint" in columns or "headers" in columns or "events" not in columns
            self._legacy[number] = known
        return known

    def _columns_of(self, cursor: Any, number: int) -> set[str]:
        known = self._columns.get(number)
        if known is None:
            try:
                self._execute(cursor, f"SELECT * FROM jobs_{number} WHERE 1 = 0")
                cursor.fetchall()
                known = {str(column[0]).lower() for column in cursor.description}
            except BaseException:
                self._connection.rollback()
                raise
            self._connection.commit()
            self._columns[number] = known
        return known

    def _events(self, cursor: Any, number: int) -> str:
        """SQL for the events a job of dataset ``number`` carries, as ``j``: its ``events``
        (a pack's members), or 1 in a dataset made before packs."""
        return "j.events" if "events" in self._columns_of(cursor, number) else "1"

    # -- reads over the live datasets ----------------------------------------------------------

    def _dataset_of(self, cursor: Any, job_id: int) -> int:
        for dataset in self._datasets:
            if dataset.holds(job_id):
                return dataset.number
        for dataset in self._load_datasets(cursor):
            if dataset.holds(job_id):
                return dataset.number
        raise JobDBError(
            f"job {job_id} is in no live dataset of {self.describe()}: check the job id (an "
            "archived job is in the archive, not the JobDB)"
        )

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
                        f"SELECT {JOINED_COLUMNS}, t.state, t.attempt, t.retry_at "
                        f"FROM jobs_{n} j LEFT JOIN job_state_transitions_{n} t ON "
                        f"t.id = (SELECT MAX(id) FROM job_state_transitions_{n} WHERE job_id = "
                        f"j.id{latest}) WHERE {where} AND j.id > ? ORDER BY j.id LIMIT ?",
                        (*latest_args, *where_args, after, limit - len(found)),
                    )
                    found.extend(job_of(row) for row in cursor.fetchall())
            self._connection.commit()
            return found
