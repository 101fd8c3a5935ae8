"""Exactly-once aggregates: ``events`` counted into SQL tables (DESIGN.md boundary 5).

A backend family: the interface and the commit protocol in ``base.py``, one module per database
beside it (``sqlite.py``, the embedded default; ``postgres.py``, which needs the ``postgres``
extra), :func:`open_db` here picking one by URL and importing it only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable

from exactly.aggregate.base import AggregateDB, Batch, Marker
from exactly.errors import AggregateError, ConfigError
from exactly.urls import redact

__all__ = ["BACKENDS", "AggregateDB", "Batch", "Marker", "open_db"]

BACKENDS = ("sqlite", "postgresql")  # URL schemes; the contract suite runs on each


def open_db(
    url: str, *, retry_seconds: float = 600.0, say: Callable[[str], None] | None = None
) -> AggregateDB:
    """The aggregate database at ``url``: ``sqlite:///FILE`` or ``postgresql://...``."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from exactly.aggregate.sqlite import SQLiteDB

        return SQLiteDB(url, retry_seconds=retry_seconds, say=say)
    if scheme in ("postgresql", "postgres"):
        try:
            from exactly.aggregate.postgres import PostgresDB
        except ImportError:
            raise AggregateError(
                "postgresql:// aggregates need psycopg 3: pip install 'exactly[postgres]'"
            ) from None
        return PostgresDB(url, retry_seconds=retry_seconds, say=say)
    raise ConfigError(
        f"aggregate database URL {redact(url)!r}: use sqlite:///FILE or postgresql://USER@HOST/DB"
    )
