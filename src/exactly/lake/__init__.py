"""The lake: every deduplicated event in an open table, exactly once (docs/lake.md).

A backend family: the interface and the commit protocol in ``base.py``, the columns in
``columns.py``, one module per backend beside them, :func:`open_table` here picking one by URL
and importing it only when asked for:

* ``delta://PATH`` (the embedded default, ``delta://DATA_DIR/lake/events``) and
  ``delta+s3://BUCKET/KEY``: Delta Lake through ``deltalake``;
* ``iceberg://DIR`` (a SQLite catalog) and ``iceberg+postgresql://USER@HOST/DB?warehouse=URI``:
  Apache Iceberg through ``pyiceberg``;
* ``postgresql://USER@HOST/DB?table=events``: a warehouse table in PostgreSQL.

The lake formats need the ``lake`` extra, PostgreSQL the ``postgres`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from exactly.errors import EnvironmentProblem, LakeError
from exactly.urls import redact

if TYPE_CHECKING:
    from exactly.lake.base import Compaction, LakeTable, Marker

__all__ = ["BACKENDS", "Compaction", "LakeTable", "Marker", "open_table"]

BACKENDS = ("delta", "iceberg", "postgresql")  # the contract suite runs on each
USAGE = "use delta://PATH, iceberg://DIR or postgresql://USER@HOST/DB?table=events"


def __getattr__(name: str) -> Any:
    """``Compaction``, ``LakeTable`` and ``Marker`` from ``base.py``, imported when first asked
    for: ``exactly.lake.settings`` (read by every command's config) must not import pyarrow."""
    if name in ("Compaction", "LakeTable", "Marker"):
        from exactly.lake import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_table(url: str) -> LakeTable:
    """The lake table at ``url`` (module docstring: the URLs)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    try:
        if scheme in ("delta", "delta+s3"):
            from exactly.lake.delta import DeltaLakeTable

            return DeltaLakeTable.from_url(url)
        if scheme in ("iceberg", "iceberg+postgresql"):
            from exactly.lake.iceberg import IcebergTable

            return IcebergTable.from_url(url)
        if scheme in ("postgresql", "postgres"):
            from exactly.lake.postgres import PostgresTable

            return PostgresTable.from_url(url)
    except ImportError as error:
        extra = "postgres" if scheme.startswith("postgres") else "lake"
        raise EnvironmentProblem(
            f"the {scheme} lake table needs the {extra} extra: pip install 'exactly[{extra}]' "
            f"({error})"
        ) from error
    raise LakeError(f"lake URL {redact(url)!r} is not understood: {USAGE}")
