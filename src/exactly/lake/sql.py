"""``exactly lake sql``: a SQL query over the lake's tables' current versions, run by DuckDB.

The table is registered in an in-memory DuckDB as ``events`` through the Arrow that its format's
own library gives (:meth:`~exactly.lake.base.LakeTable.dataset`: deltalake's dataset, pyiceberg's
scan, the PostgreSQL table's rows), so no DuckDB extension is needed (none can be downloaded
here) and the query sees one committed version of each table, whatever the lake query commits
meanwhile.

With the segment layout (``siblings``), the tables beside it (``tracks``, ``order_completed``,
``users`` …) are registered under their own names too, but only those the query's text names
(DuckDB's parser lists them: :func:`named`). Registering one opens the table (Delta: its log;
Iceberg and PostgreSQL: its rows, as :meth:`~exactly.lake.base.LakeTable.dataset` gives them), so
registering all of 300 tables for a query that reads two would cost the other 298
(docs/segment.md has the figures). A table named only inside a string (``SHOW TABLES`` lists
the registered ones) is not seen: name it in the query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from exactly.errors import EnvironmentProblem, LakeError
from exactly.lake.base import LakeTable

NAME = "events"  # what the query calls the table


def query(table: LakeTable, text: str, *, siblings: bool = False) -> pa.Table:
    """The rows ``text`` returns over ``table`` (called :data:`NAME` in it), as Arrow; with
    ``siblings``, over each table beside it that ``text`` names, under its name."""
    sources: dict[str, LakeTable] = {NAME: table}
    with contextlib.ExitStack() as opened:
        if siblings:
            wanted = named(text)
            for name in table.siblings():
                if name.lower() in wanted and name != table.name and name.lower() != NAME:
                    sources[name] = opened.enter_context(table.sibling(name))
        return run(sources, text)


def run(sources: Mapping[str, LakeTable], text: str) -> pa.Table:
    """The rows ``text`` returns with each table of ``sources`` registered under its key."""
    duckdb = _duckdb()
    with duckdb.connect() as connection:
        connection.execute("SET TimeZone = 'UTC'")  # a timestamp's date is its UTC day
        for name, table in sources.items():
            source: Any = table.dataset()
            connection.register(name, source)
        try:
            relation = connection.sql(text)
            # a statement that returns no rows (SET, CREATE VIEW ...) gives no relation
            return pa.table({}) if relation is None else relation.to_arrow_table()
        except duckdb.Error as error:
            raise LakeError(_first_line(error)) from None


def named(text: str) -> set[str]:
    """The tables ``text`` names, in lower case, as DuckDB's parser finds them (none for text
    that does not parse: the query then fails with DuckDB's own message)."""
    duckdb = _duckdb()
    try:
        found = duckdb.get_table_names(text)
    except duckdb.Error:
        return set()
    return {str(name).rsplit(".", 1)[-1].strip('"').lower() for name in found}


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as error:
        raise EnvironmentProblem(
            f"exactly lake sql needs duckdb: pip install 'exactly[lake]' ({error})"
        ) from error
    return duckdb


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(error).__name__
