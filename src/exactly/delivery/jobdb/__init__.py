"""The JobDB family: the jobs waiting to be delivered and every attempt at delivering them.

There is one JobDB, :data:`JobDB`: its SQL is written once, in the ``sql`` package, and a
module per backend beside it fills in a connection, a dialect and its locks: ``sqlite.py``
(``sqlite://DIR``, the embedded default), ``postgres.py`` (``postgresql://...``, the ``postgres``
extra), ``mysql.py`` (``mysql://user:password@host:port/database``, the ``mysql`` extra). Its
users take it through the narrow face of their role (``faces.py``: the router, replay, the
director, the operators' commands, the readers); ``base.py`` has the states and data types they
share. :func:`open_jobdb` imports a backend only when asked for; :func:`opened_jobdb` also
connects once, so a command stops with one line when it cannot; :data:`BACKENDS` lists the
schemes the contract suite runs on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from exactly.delivery.jobdb.base import Job, NewJob, Transition
from exactly.delivery.jobdb.sql import SQLJobDB
from exactly.errors import ConfigError, EnvironmentProblem, ExactlyError, JobDBError
from exactly.urls import redact, scrub

__all__ = ["BACKENDS", "Job", "JobDB", "NewJob", "Transition", "open_jobdb", "opened_jobdb"]

BACKENDS = ["sqlite", "postgresql", "mysql"]
_EXTRA = {"postgresql": "postgres", "mysql": "mysql"}

JobDB = SQLJobDB  # the whole JobDB, every face of it: what open_jobdb returns


def open_jobdb(url: str, **options: Any) -> JobDB:
    """The JobDB at ``url``; ``options`` (``dataset_rows``, ``dataset_minutes``) go to it."""
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme == "postgres":
        scheme, url = "postgresql", "postgresql" + url[len("postgres") :]
    if scheme not in BACKENDS:
        raise ConfigError(
            f"JobDB URL {redact(url)!r} is not understood: use sqlite://DIR, "
            "postgresql://USER@HOST/DB or mysql://USER@HOST/DB"
        )
    try:
        if scheme == "sqlite":
            from exactly.delivery.jobdb.sqlite import SqliteJobDB

            return SqliteJobDB(url, **options)
        if scheme == "postgresql":
            from exactly.delivery.jobdb.postgres import PostgresJobDB

            return PostgresJobDB(url, **options)
        from exactly.delivery.jobdb.mysql import MySQLJobDB

        return MySQLJobDB(url, **options)
    except ImportError as error:
        raise EnvironmentProblem(
            f"the {scheme} JobDB needs the {_EXTRA[scheme]} extra: "
            f"pip install 'exactly[{_EXTRA[scheme]}]' ({error})"
        ) from error


@contextlib.contextmanager
def opened_jobdb(url: str, **options: Any) -> Iterator[JobDB]:
    """The JobDB at ``url``, connected once before any work: a database that does not exist, a
    wrong password or a server that does not answer stops the command with one line naming the
    JobDB (password masked) and the driver's reason, not the driver's traceback."""
    database = open_jobdb(url, **options)
    try:
        database.datasets()  # the first use connects (and creates the tables)
    except ExactlyError:
        database.close()
        raise
    except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
        with contextlib.suppress(Exception):
            database.close()
        raise JobDBError(
            f"cannot open the JobDB {database.describe()}: {_reason(error, url)}; check its URL "
            "(--jobdb, EXACTLY_DELIVERY__JOBDB or [delivery] jobdb), that the server runs and "
            "that the database exists"
        ) from None
    with database:
        yield database


def _reason(error: Exception, url: str) -> str:
    """The driver's message on one line, without the password it might quote."""
    args = error.args
    text = args[1] if len(args) == 2 and isinstance(args[0], int) else str(error)  # PyMySQL's
    try:
        secrets = [urlsplit(url).password or ""]
    except ValueError:
        secrets = []
    return " ".join(scrub(str(text) or type(error).__name__, secrets).split())[:300]
