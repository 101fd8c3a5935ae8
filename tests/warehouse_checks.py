"""What a warehouse (the segment layout's tables) must hold after some events, checked the same
way by the warehouse's own tests and by the Spark crash tests that run the layout.

:func:`expected` is each table's ids recomputed from the events in plain Python; :func:`ids`
and :func:`rows` read the tables through exactly's code; :func:`read_back` reads them in a fresh
process with each format's own library (``tests/warehouse_child.py``), which shares no code with
the writer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from exactly.lake.delta import DeltaLakeTable
from exactly.lake.iceberg import IcebergTable
from exactly.lake.postgres import PostgresTable
from exactly.lake.segment import merge_all, profile_rows, profiles, schema_kinds
from exactly.lake.warehouse import Warehouse

# the event names of tests/warehouse_events.py and tests/aggregate_stream.py, as tables
SLUGS = {
    "Order Completed": "order_completed",
    "Product Viewed": "product_viewed",
    "Signed Up": "signed_up",
    "Cart Updated": "cart_updated",
}
TABLES = {"identify": "identifies", "page": "pages", "screen": "screens", "group": "groups"}
TABLES["alias"] = "aliases"
ROOT = Path(__file__).resolve().parents[1]


def expected(events: Iterable[dict[str, Any]]) -> dict[str, list[str]]:
    """Each table's ids after ``events``, sorted: one row per event, one per user and group."""
    found: dict[str, list[str]] = defaultdict(list)
    merged: dict[str, set[str]] = defaultdict(set)
    for event in events:
        if event["type"] == "track":
            found["tracks"].append(event["messageId"])
            found[SLUGS[event["event"]]].append(event["messageId"])
        else:
            found[TABLES[event["type"]]].append(event["messageId"])
        if event["type"] == "identify":
            merged["users"].add(event["userId"])
        if event["type"] == "group":
            merged["accounts"].add(event["groupId"])
    return {name: sorted(ids) for name, ids in {**found, **merged}.items()}


def ids(warehouse: Warehouse) -> dict[str, list[str]]:
    """Each table's ids as stored, sorted: a duplicate shows."""
    return {
        name: sorted(warehouse.read(name).column("id").to_pylist()) for name in warehouse.tables()
    }


def rows(warehouse: Warehouse, name: str) -> list[dict[str, Any]]:
    found = warehouse.read(name).to_pylist()
    return sorted(found, key=lambda row: (row["id"], str(row.get("uuid_ts"))))


def kinds(warehouse: Warehouse, name: str) -> dict[str, str]:
    schema = warehouse.table(name).schema()
    assert schema is not None, name
    return schema_kinds(schema)


def recomputed_users(warehouse: Warehouse, events: Sequence[dict[str, Any]]) -> list[Any]:
    """``users`` from every identify of ``events`` at once, typed as the table's columns."""
    merged = merge_all(profiles(events, table="users").values())
    typed = profile_rows(
        merged.values(),
        kinds(warehouse, "users"),
        table="users",
        can_widen=warehouse.can_widen,
    )
    return sorted(typed.rows.to_pylist(), key=lambda row: row["id"])


def reader_args(warehouse: Warehouse) -> list[str]:
    """How the fresh process finds the tables without exactly's code."""
    events = warehouse.events
    if isinstance(events, DeltaLakeTable):
        return ["delta", events.uri.rsplit("/", 1)[0], events.name]
    if isinstance(events, IcebergTable):
        return ["iceberg", events.catalog_uri, events.warehouse, events.name]
    assert isinstance(events, PostgresTable)
    return ["postgresql", events.conninfo, events.name]


def read_back(warehouse: Warehouse) -> dict[str, Any]:
    """Every table of the layout read in a fresh process by its format's own library: table ->
    {"ids": sorted ids, "types": {column: Arrow type}}."""
    found = subprocess.run(
        [sys.executable, "-m", "tests.warehouse_child", *reader_args(warehouse)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    tables: dict[str, Any] = json.loads(found.stdout)
    return tables


def assert_warehouse(url: str, events: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """The layout beside the events table at ``url`` holds ``events`` exactly: each table each
    id once, ``users`` equal to a recomputation from the identifies, the same ids read back in a
    fresh process. Returns the tables' ids."""
    truth = expected(events)
    with Warehouse.open(url) as warehouse:
        stored = ids(warehouse)
        assert sorted(stored) == sorted(truth), (sorted(stored), sorted(truth))
        for name, found in stored.items():
            assert len(found) == len(set(found)), f"{name}: an id twice"
            assert found == truth[name], f"{name}: {len(found)} rows, {len(truth[name])} expected"
        if "users" in truth:
            assert rows(warehouse, "users") == recomputed_users(warehouse, events)
        back = read_back(warehouse)
    assert {name: table["ids"] for name, table in back.items()} == truth
    return truth
