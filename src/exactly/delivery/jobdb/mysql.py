"""The JobDB in MySQL or MariaDB (``mysql://user:password@host:port/database``, the ``mysql``
extra: PyMySQL, pure Python; mysqlclient needs the MySQL C client to build, see docs/benchmarks.md).

Guarantee: a transaction is durable on return (InnoDB, ``innodb_flush_log_at_trx_commit=1`` as by
default). Sessions run at READ COMMITTED; routers serialize on the newest dataset's row. DDL
commits implicitly in MySQL, so dataset tables are created before the transaction that fills them.
The director's lock is ``GET_LOCK`` named after the database, held on its own connection; the
server releases it when that connection ends. A partition's lease is a ``GET_LOCK`` named after
the database and the partition, taken on the connection the director writes on
(``sql/leasing.py``; MariaDB holds several named locks per session).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pymysql

from exactly.delivery.jobdb.base import HELD, RUNNING
from exactly.delivery.jobdb.sql import MARKER_COLUMNS, SQLJobDB
from exactly.errors import DirectorLockHeld, ReplayRunning

# lock names are 64 characters at most: a hash of the database and the partition
_LEASE = "CONCAT('exactly-partition:', SHA1(CONCAT(DATABASE(), ':', %s)))"


class MySQLJobDB(SQLJobDB):
    scheme = "mysql"
    types: ClassVar[dict[str, str]] = {
        "id": "BIGINT",
        "serial": "BIGINT AUTO_INCREMENT PRIMARY KEY",
        "text": "VARCHAR(255)",
        "body": "MEDIUMTEXT",
        "blob": "LONGBLOB",
        "real": "DOUBLE",
    }

    inline_indexes = True
    # MariaDB reads DISTINCT on an index's first column by a loose index scan of its own
    _distinct_buckets = "SELECT DISTINCT bucket FROM jobs_{n}"

    def _options(self) -> dict[str, Any]:
        parts = urlsplit(self.url)
        return {
            "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 3306,
            "user": unquote(parts.username or "root"),
            "password": unquote(parts.password or ""),
            "database": parts.path.lstrip("/") or "exactly",
            "charset": "utf8mb4",
            "connect_timeout": 10,
        }

    def _connect(self) -> Any:
        connection = pymysql.connect(**self._options(), autocommit=False)
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return connection

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def _scrub(self, cursor: Any, tables: Sequence[str]) -> None:
        """``OPTIMIZE TABLE`` rebuilds each table, leaving no changed row's old bytes in it."""
        for table in dict.fromkeys(tables):
            cursor.execute(f"OPTIMIZE TABLE {table}")
            cursor.fetchall()
        self._connection.commit()

    def _begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN")

    def _list_tables(self) -> str:
        return "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"

    def _lock_datasets(self, cursor: Any, tables: Sequence[str]) -> None:
        """DDL commits at once in MariaDB, so a transaction cannot hold routers off across the
        DROP; ``LOCK TABLES ... WRITE`` does (their ``SELECT ... FOR UPDATE`` waits for it, and it
        waits for a router already inside its transaction), and a WRITE-locked table may be
        dropped."""
        locks = ", ".join(f"{name} WRITE" for name in ("jobdb_datasets", *tables))
        cursor.execute(f"LOCK TABLES {locks}")

    def _unlock_datasets(self, cursor: Any) -> None:
        cursor.execute("UNLOCK TABLES")
        self._connection.commit()

    def _upsert_marker(self) -> str:
        return (
            f"INSERT INTO jobdb_markers ({MARKER_COLUMNS}) VALUES (?, ?, ?, ?, ?) "
            "ON DUPLICATE KEY UPDATE batch_id = VALUES(batch_id), stream = VALUES(stream), "
            "end_offsets = VALUES(end_offsets), committed_at = VALUES(committed_at)"
        )

    _lock_connection: Any = None

    @contextlib.contextmanager
    def director_lock(self, *, wait: bool = True) -> Iterator[None]:
        self._lock_connection = self._take_lock(wait=wait)
        try:
            yield  # the lock goes with the connection
        finally:
            connection, self._lock_connection = self._lock_connection, None
            if connection is not None:
                connection.close()

    def _take_lock(self, *, wait: bool) -> Any:
        connection = pymysql.connect(**self._options(), autocommit=True)
        try:
            with connection.cursor() as cursor:
                while True:
                    cursor.execute("SELECT GET_LOCK(CONCAT('exactly-director:', DATABASE()), 0)")
                    if cursor.fetchone()[0] == 1:
                        return connection
                    if not wait:
                        raise DirectorLockHeld(
                            f"another director holds the lock of {self.describe()}; {HELD}"
                        )
                    time.sleep(0.2)
        except BaseException:
            connection.close()
            raise

    def keep_lock(self) -> None:
        connection = self._lock_connection
        if connection is None:
            return
        try:
            connection.ping(reconnect=False)
            return
        except pymysql.Error:
            with contextlib.suppress(pymysql.Error):
                connection.close()
        self._lock_connection = self._take_lock(wait=False)

    def _try_lease(self, cursor: Any, partition: int) -> bool:
        cursor.execute(f"SELECT GET_LOCK({_LEASE}, 0)", (partition,))
        return bool(cursor.fetchone()[0] == 1)

    def _drop_lease(self, cursor: Any, partition: int) -> None:
        cursor.execute(f"SELECT RELEASE_LOCK({_LEASE})", (partition,))
        cursor.fetchall()

    @contextlib.contextmanager
    def replay_lock(self, destination: str, kind: str = "replay") -> Iterator[None]:
        name = "CONCAT('exactly-', %s, ':', SHA1(CONCAT(DATABASE(), ':', %s)))"  # <= 64 chars
        connection = pymysql.connect(**self._options(), autocommit=True)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT GET_LOCK({name}, 0)", (kind, destination))
                if cursor.fetchone()[0] != 1:
                    raise ReplayRunning(
                        f"another {kind} of {destination!r} is running on {self.describe()}; "
                        f"{RUNNING}"
                    )
            try:
                yield  # a holder that dies loses the lock with its connection
            finally:
                with contextlib.suppress(pymysql.Error), connection.cursor() as cursor:
                    # released before the close, as in postgres.py
                    cursor.execute(f"SELECT RELEASE_LOCK({name})", (kind, destination))
        finally:
            connection.close()
