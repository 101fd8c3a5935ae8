"""A process for the warehouse's crash and read-back tests.

Usage:

* ``python -m tests.warehouse_child write URL QUERY FIRST LAST [CUT]``: commits batches FIRST to
  LAST of :func:`tests.warehouse_events.sdk_events` (batch ``b`` is events ``b*SIZE`` ..) to the
  warehouse beside the events table at URL, printing ``TABLE BATCH committed|replayed`` as each
  table is done. With CUT, one table at a time, and after CUT tables of batch FIRST it prints
  ``cut`` and waits to be killed: a kill between two tables of one batch.
* ``python -m tests.warehouse_child delta ROOT EVENTS`` / ``iceberg CATALOG_URI WAREHOUSE
  EVENTS`` / ``postgresql CONNINFO EVENTS``: every table of the layout beside the events table
  EVENTS read with the format's own library (not exactly's), printed as JSON: table -> [id, ...]
  and table -> {column: Arrow type}. On PostgreSQL the layout's tables are those with a batch in
  ``exactly_lake_batches`` (the schema may hold others).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIZE = 40
LOADED = datetime(2026, 3, 2, tzinfo=UTC)


def write(url: str, query: str, first: int, last: int, cut: int | None) -> None:
    from exactly.lake import Marker
    from exactly.lake.warehouse import Outcome, Warehouse
    from tests.warehouse_events import sdk_events

    done = 0

    def progress(table: str, outcome: Outcome) -> None:
        nonlocal done
        print(table, batch, "committed" if outcome.committed else "replayed", flush=True)
        done += 1
        if cut is not None and done == cut:
            print("cut", flush=True)
            time.sleep(600)

    with Warehouse.open(url, workers=1 if cut is not None else 4) as warehouse:
        print("ready", flush=True)
        for batch in range(first, last + 1):
            events = sdk_events(batch * SIZE, SIZE)
            warehouse.write(events, Marker(query, batch), loaded_at=LOADED, progress=progress)


def read_delta(root: str, events: str) -> dict[str, Any]:
    from deltalake import DeltaTable

    tables = {}
    for path in sorted(Path(root).iterdir()):
        if (path / "_delta_log").is_dir() and path.name != events:
            tables[path.name] = DeltaTable(str(path)).to_pyarrow_table()
    return tables


def read_iceberg(catalog_uri: str, warehouse: str, events: str) -> dict[str, Any]:
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("exactly", uri=catalog_uri, warehouse=warehouse)
    return {
        name: catalog.load_table((namespace, name)).scan().to_arrow()
        for namespace, name in catalog.list_tables("exactly")
        if name != events
    }


def read_postgresql(conninfo: str, events: str) -> dict[str, Any]:
    import psycopg
    import pyarrow as pa  # type: ignore[import-untyped]

    tables = {}
    with psycopg.connect(conninfo) as connection:
        names = connection.execute(
            "SELECT DISTINCT table_name FROM exactly_lake_batches WHERE table_name <> %s",
            (events,),
        ).fetchall()
        for (name,) in names:
            cursor = connection.execute(f'SELECT * FROM "{name}"')
            columns = [column.name for column in cursor.description or ()]
            tables[name] = pa.Table.from_pylist(
                [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            )
    return tables


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "write":
        url, query, first, last, *cut = args
        write(url, query, int(first), int(last), int(cut[0]) if cut else None)
        return
    readers = {"delta": read_delta, "iceberg": read_iceberg, "postgresql": read_postgresql}
    tables = readers[command](*args)
    print(
        json.dumps(
            {
                name: {
                    "ids": sorted(map(str, table.column("id").to_pylist())),
                    "types": {field.name: str(field.type) for field in table.schema},
                }
                for name, table in sorted(tables.items())
            }
        ),
        flush=True,
    )
    # deltalake's and Arrow's native threads may abort the interpreter's teardown ("terminate
    # called without an active exception", delta-io/delta-rs#2184) after the work is done
    os._exit(0)


if __name__ == "__main__":
    main()
