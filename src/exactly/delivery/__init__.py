"""Delivery: events to HTTP destinations, Centrifuge's way (docs/delivery.md).

``settings.py`` holds ``[[destinations]]``; the JobDB interface is in ``base.py`` with one module
per backend beside it: ``sqlite://DIR`` (embedded default), ``postgresql://...`` (the ``postgres``
extra), ``mysql://user:password@host:port/database`` (the ``mysql`` extra). :func:`open_jobdb`
imports a backend only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactly.errors import ConfigError, EnvironmentProblem
from exactly.urls import redact

if TYPE_CHECKING:
    from exactly.delivery.base import JobDB

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
            from exactly.delivery.sqlite import SqliteJobDB

            return SqliteJobDB(url, **options)
        if scheme == "postgresql":
            from exactly.delivery.postgres import PostgresJobDB

            return PostgresJobDB(url, **options)
        from exactly.delivery.mysql import MySQLJobDB

        return MySQLJobDB(url, **options)
    except ImportError as error:
        raise EnvironmentProblem(
            f"the {scheme} JobDB needs the {_EXTRA[scheme]} extra: "
            f"pip install 'exactly[{_EXTRA[scheme]}]' ({error})"
        ) from error
