"""The JobDB family: the jobs waiting to be delivered and every attempt at delivering them.

The interface is in ``base.py`` with one module per backend beside it: ``sqlite.py``
(``sqlite://DIR``, the embedded default), ``postgres.py`` (``postgresql://...``, the ``postgres``
extra), ``mysql.py`` (``mysql://user:password@host:port/database``, the ``mysql`` extra). Their
SQL is written once, in the ``sql`` package. :func:`open_jobdb` imports a backend only when asked
for; :data:`BACKENDS` lists the schemes the contract suite runs on.
"""

from __future__ import annotations

from typing import Any

from exactly.delivery.jobdb.base import Job, JobDB, NewJob, Transition
from exactly.errors import ConfigError, EnvironmentProblem
from exactly.urls import redact

__all__ = ["BACKENDS", "Job", "JobDB", "NewJob", "Transition", "open_jobdb"]

BACKENDS = ["sqlite", "postgresql", "mysql"]
_EXTRA = {"postgresql": "postgres", "mysql": "mysql"}


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
