"""JobDBs for tests: a directory for SQLite, a fresh schema in the local PostgreSQL, a fresh
database in the local MariaDB. Under ``CI=true`` a missing server fails the test (conftest.require).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

MYSQL = "mysql://root@127.0.0.1:3306/test"


def mysql_missing() -> str | None:
    """None when the MariaDB at 127.0.0.1:3306 (root, no password) answers, else why not."""
    try:
        import pymysql
    except ImportError:
        return "MariaDB tests need PyMySQL: pip install -e '.[dev]'"
    try:
        pymysql.connect(host="127.0.0.1", port=3306, user="root", connect_timeout=3).close()
        return None
    except pymysql.Error as error:
        return f"no MariaDB at {MYSQL}: {error}"


@contextlib.contextmanager
def mysql_database() -> Iterator[str]:
    import pymysql

    name = f"exactly_test_{uuid.uuid4().hex[:12]}"
    connection = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        yield f"mysql://root@127.0.0.1:3306/{name}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        connection.close()


@contextlib.contextmanager
def jobdb_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an empty JobDB of ``backend``."""
    from tests.aggregate_db import postgres_missing, postgres_schema
    from tests.conftest import require

    if backend == "sqlite":
        yield f"sqlite://{tmp_path / 'jobdb'}"
    elif backend == "postgresql":
        require(postgres_missing())
        with postgres_schema() as url:
            yield url
    elif backend == "mysql":
        require(mysql_missing())
        with mysql_database() as url:
            yield url
    else:
        raise AssertionError(f"no test JobDB for backend {backend!r}: add one to tests/jobdb.py")
