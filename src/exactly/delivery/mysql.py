"""The JobDB in MySQL or MariaDB (``mysql://user:password@host:port/database``, the ``mysql``
extra: PyMySQL, pure Python; mysqlclient needs the MySQL C client to build, see docs/benchmarks.md).

Guarantee: a transaction is durable on return (InnoDB, ``innodb_flush_log_at_trx_commit=1`` as by
default). Sessions run at READ COMMITTED; routers serialize on the newest dataset's row. DDL
commits implicitly in MySQL, so dataset tables are created before the transaction that fills them.
The director's lock is ``GET_LOCK`` named after the database, held on its own connection; the
server releases it when that connection ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pymysql

from exactly.delivery.base import DirectorLockHeld
from exactly.delivery.sql import SQLJobDB


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

    def _begin(self, cursor: Any) -> None:
        cursor.execute("BEGIN")

    def _upsert_marker(self) -> str:
        return (
            "INSERT INTO jobdb_markers (query_id, batch_id) VALUES (?, ?) "
            "ON DUPLICATE KEY UPDATE batch_id = VALUES(batch_id)"
        )

    @contextlib.contextmanager
    def director_lock(self, *, wait: bool = True) -> Iterator[None]:
        connection = pymysql.connect(**self._options(), autocommit=True)
        try:
            with connection.cursor() as cursor:
                while True:
                    cursor.execute("SELECT GET_LOCK(CONCAT('exactly-director:', DATABASE()), 0)")
                    if cursor.fetchone()[0] == 1:
                        break
                    if not wait:
                        raise DirectorLockHeld(
                            f"another director holds the lock of {self.describe()}"
                        )
                    time.sleep(0.2)
            yield  # the lock goes with the connection
        finally:
            connection.close()
