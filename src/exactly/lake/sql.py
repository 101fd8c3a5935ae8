"""``exactly lake sql``: a SQL query over the lake table's current version, run by DuckDB.

The table is registered in an in-memory DuckDB as ``events`` through the Arrow that its format's
own library gives (:meth:`~exactly.lake.base.LakeTable.dataset`: deltalake's dataset, pyiceberg's
scan, the PostgreSQL table's rows), so no DuckDB extension is needed (none can be downloaded
here) and the query sees one committed version, whatever the lake query commits meanwhile.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.errors import EnvironmentProblem, LakeError
from exactly.lake.base import LakeTable

NAME = "events"  # what the query calls the table


def query(table: LakeTable, text: str) -> pa.Table:
    """The rows ``text`` returns over ``table`` (called :data:`NAME` in it), as Arrow."""
    try:
        import duckdb
    except ImportError as error:
        raise EnvironmentProblem(
            f"exactly lake sql needs duckdb: pip install 'exactly[lake]' ({error})"
        ) from error
    source: Any = table.dataset()
    with duckdb.connect() as connection:
        connection.register(NAME, source)
        try:
            relation = connection.sql(text)
            # a statement that returns no rows (SET, CREATE VIEW ...) gives no relation
            return pa.table({}) if relation is None else relation.to_arrow_table()
        except duckdb.Error as error:
            raise LakeError(_first_line(error)) from None


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__
