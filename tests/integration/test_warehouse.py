"""The segment layout's tables on every lake backend, each committed exactly once per batch.

Real backends (tests/lake_tables.py): Delta and Iceberg (SQLite catalog) on local directories,
Iceberg with its catalog in PostgreSQL, PostgreSQL; events from tests/warehouse_events.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from exactly.lake import Marker
from exactly.lake.delta import DeltaLakeTable
from exactly.lake.iceberg import IcebergTable
from exactly.lake.warehouse import Warehouse
from tests.archives import MotoServer
from tests.lake_tables import S3_CASES, lake_url
from tests.warehouse_checks import TABLES, expected, ids, kinds, read_back, recomputed_users, rows
from tests.warehouse_child import LOADED, SIZE
from tests.warehouse_events import sdk_event, sdk_events

CASES = ("delta", "iceberg", "iceberg+postgresql", "postgresql")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=CASES)
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(case: str, tmp_path: Path) -> Iterator[str]:
    with lake_url(case, tmp_path) as found:
        yield found


@pytest.fixture
def warehouse(url: str) -> Iterator[Warehouse]:
    with Warehouse.open(url) as opened:
        yield opened


def batch_events(batch: int) -> list[dict[str, Any]]:
    """Batch ``batch`` as the crash child writes it."""
    return sdk_events(batch * SIZE, SIZE)


def by_id(warehouse: Warehouse, name: str) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in rows(warehouse, name)}


def test_sdk_events_go_to_their_tables_with_typed_columns(warehouse: Warehouse) -> None:
    events = batch_events(0)
    outcomes = warehouse.write(events, Marker("q1", 0), loaded_at=LOADED)
    want = expected(events)
    assert set(want) == {"order_completed", "product_viewed", "tracks", *TABLES.values()} | {
        "users",
        "accounts",
    }
    assert sorted(outcomes) == sorted(want)
    assert all(outcome.committed for outcome in outcomes.values())
    assert outcomes["tracks"].rows == len(want["tracks"])
    assert ids(warehouse) == want
    order = kinds(warehouse, "order_completed")
    assert {c: order[c] for c in ("revenue", "total", "products", "shipping_cost")} == {
        "revenue": "bigint",
        "total": "double",
        "products": "string",
        "shipping_cost": "bigint",
    }
    assert (order["timestamp"], order["context_user_agent_data_mobile"]) == ("timestamp", "boolean")
    assert order["event"] == order["event_text"] == order["order_id"] == "string"
    assert kinds(warehouse, "identifies")["created_at"] == "timestamp"
    assert kinds(warehouse, "users")["logins"] == "bigint"
    assert kinds(warehouse, "screens")["load_time_ms"] == "bigint"
    assert kinds(warehouse, "accounts")["employees"] == "bigint"
    assert "revenue" not in kinds(warehouse, "tracks")  # tracks holds no properties
    one = by_id(warehouse, "order_completed")["ajs-next-000001"]
    assert (one["revenue"], one["total"], one["shipping_method"]) == (1, 1.5, "express")
    assert json.loads(one["products"]) == [{"price": 19, "product_id": "p1", "sku": "45790-32"}]
    assert one["event"] == "order_completed" and one["event_text"] == "Order Completed"
    assert one["timestamp"] == datetime(2026, 3, 1, 10, 0, 1, tzinfo=UTC)
    assert one["context_campaign_name"] == "spring_sale" and one["_rejected"] is None
    screen = by_id(warehouse, "screens")["ios-000004"]
    assert (screen["name"], screen["context_os_name"], screen["variation"]) == (
        "Home",
        "iOS",
        "blue",
    )
    assert by_id(warehouse, "aliases")["ajs-next-000006"]["previous_id"] == "anon-1"
    assert by_id(warehouse, "groups")["ajs-next-000005"]["group_id"] == "org-2"
    assert by_id(warehouse, "pages")["ajs-next-000003"]["path"] == "/checkout"
    users = by_id(warehouse, "users")
    newest = max((e for e in events if e["type"] == "identify" and e["userId"] == "user-2"),
                 key=lambda e: e["timestamp"])  # fmt: skip
    assert users["user-2"]["plan"] == newest["traits"]["plan"]
    assert users["user-2"]["logins"] == newest["traits"]["logins"]
    assert users["user-2"]["address_city"] == "Austin"
    assert by_id(warehouse, "accounts")["org-2"]["name"] == "Org 2"


def test_a_later_batch_adds_a_column(warehouse: Warehouse) -> None:
    warehouse.write(batch_events(0), Marker("q1", 0), loaded_at=LOADED)
    order = {**sdk_event(1), "messageId": "late-1"}
    order["properties"] = {**order["properties"], "giftWrap": True}
    identify = {**sdk_event(2), "messageId": "late-2", "timestamp": "2026-04-01T00:00:00Z"}
    identify["traits"] = {"company": {"name": "Initech"}}
    warehouse.write([order, identify], Marker("q1", 1), loaded_at=LOADED)
    assert kinds(warehouse, "order_completed")["gift_wrap"] == "boolean"
    orders = by_id(warehouse, "order_completed")
    assert orders["late-1"]["gift_wrap"] is True
    assert orders["ajs-next-000001"]["gift_wrap"] is None
    assert by_id(warehouse, "identifies")["late-2"]["company_name"] == "Initech"
    user = by_id(warehouse, "users")["user-2"]
    assert (user["company_name"], user["address_city"]) == ("Initech", "Austin")  # kept


def test_upkeep_compacts_and_expires_every_table_and_keeps_its_rows(warehouse: Warehouse) -> None:
    """What the lake query's upkeep runs on each table between batches (Iceberg's tables of the
    layout have no partition: they are rewritten whole)."""
    for batch in range(3):
        warehouse.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
    before = {name: rows(warehouse, name) for name in TABLES}
    for name in warehouse.tables():
        table = warehouse.table(name)
        table.optimize()
        table.expire(timedelta(0))
        assert table.optimize().files_removed == 0  # nothing left to compact
    warehouse.write(batch_events(2), Marker("q1", 2), loaded_at=LOADED)  # a replay: skipped
    for name in TABLES:
        found = sorted(rows(warehouse, name), key=lambda row: str(row["id"]))
        assert found == sorted(before[name], key=lambda row: str(row["id"])), name
    assert warehouse.table("tracks").committed("q1") == 2


def test_a_value_that_does_not_fit_is_null_and_kept_in_rejected(warehouse: Warehouse) -> None:
    warehouse.write(batch_events(0), Marker("q1", 0), loaded_at=LOADED)
    free = {**sdk_event(1), "messageId": "free"}
    free["properties"] = {**free["properties"], "revenue": "free", "total": "n/a"}
    half = {**sdk_event(1), "messageId": "half"}
    half["properties"] = {**half["properties"], "revenue": 12.5}
    many = {**sdk_event(2), "messageId": "many", "timestamp": "2026-04-01T00:00:00Z"}
    many["traits"] = {"logins": "many"}
    outcomes = warehouse.write([free, half, many], Marker("q1", 1), loaded_at=LOADED)
    assert outcomes["order_completed"].committed
    orders = by_id(warehouse, "order_completed")
    assert (orders["free"]["revenue"], orders["free"]["total"]) == (None, None)
    assert json.loads(orders["free"]["_rejected"]) == {"revenue": "free", "total": "n/a"}
    if warehouse.can_widen:  # PostgreSQL: the bigint column became double in the commit
        assert kinds(warehouse, "order_completed")["revenue"] == "double"
        assert orders["half"]["revenue"] == 12.5 and orders["half"]["_rejected"] is None
        assert orders["ajs-next-000001"]["revenue"] == 1.0
    else:
        assert kinds(warehouse, "order_completed")["revenue"] == "bigint"
        assert orders["half"]["revenue"] is None
        assert json.loads(orders["half"]["_rejected"]) == {"revenue": 12.5}
    user = by_id(warehouse, "users")["user-2"]
    assert user["logins"] is None and json.loads(user["_rejected"]) == {"logins": "many"}
    assert json.loads(by_id(warehouse, "identifies")["many"]["_rejected"]) == {"logins": "many"}


def test_a_replayed_batch_changes_nothing_in_any_table(url: str) -> None:
    with Warehouse.open(url) as first:
        for batch in range(2):
            first.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
        before = {name: rows(first, name) for name in first.tables()}
        versions = {name: first.table(name).version() for name in first.tables()}
    with Warehouse.open(url) as again:  # as after a restart: nothing kept in memory
        for batch in (1, 0):
            outcomes = again.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
            assert outcomes and not any(o.committed for o in outcomes.values()), outcomes
        assert {name: rows(again, name) for name in again.tables()} == before
        assert {name: again.table(name).version() for name in again.tables()} == versions
        assert again.committed("q1") == {name: 1 for name in before}
        assert again.committed("q2") == {name: None for name in before}


def child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.warehouse_child", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        stdout=subprocess.PIPE,
        text=True,
    )


def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the child ended ({process.wait()}) before saying it was ready"
    return line.strip()


@pytest.mark.parametrize("cut", [1, 6])
def test_a_batch_killed_between_two_tables_commits_the_rest_on_replay(url: str, cut: int) -> None:
    with Warehouse.open(url) as warehouse:
        warehouse.write(batch_events(0), Marker("q1", 0), loaded_at=LOADED)
    process = child("write", url, "q1", "1", "1", str(cut))
    try:
        lines = []
        while (line := read_line(process)) != "cut":
            lines.append(line)
        with Warehouse.open(url) as warehouse:  # the child waits between two tables
            marked = warehouse.committed("q1")
            assert sum(1 for batch in marked.values() if batch == 1) == cut, (marked, lines)
            assert sum(1 for batch in marked.values() if batch == 0) == len(marked) - cut
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    events = batch_events(0) + batch_events(1)
    with Warehouse.open(url) as warehouse:
        outcomes = warehouse.write(batch_events(1), Marker("q1", 1), loaded_at=LOADED)
        assert sum(1 for o in outcomes.values() if not o.committed) == cut
        assert ids(warehouse) == expected(events)
        assert rows(warehouse, "users") == recomputed_users(warehouse, events)


def test_kills_inside_batches_then_replays_leave_every_id_once(url: str) -> None:
    """SIGKILLs while the child commits batches on its threads, each after a chosen number of
    tables were done, so that a batch is cut (at most ``workers`` further tables finish)."""
    last, rng = 5, random.Random(42)
    per_batch = len(expected(batch_events(0)))
    cuts = []
    for _ in range(3):
        process = child("write", url, "q1", "0", str(last))
        try:
            assert read_line(process) == "ready"
            done = rng.randrange(last + 1) * per_batch + rng.randint(1, per_batch - 5)
            for _ in range(done):
                read_line(process)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        with Warehouse.open(url) as warehouse:
            cuts.append(len(set(warehouse.committed("q1").values())) > 1)
    assert all(cuts)  # each kill left some tables with a batch that others lack
    events = [event for batch in range(last + 1) for event in batch_events(batch)]
    with Warehouse.open(url) as warehouse:
        for batch in range(last + 1):
            warehouse.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
        assert ids(warehouse) == expected(events)
        assert set(warehouse.committed("q1").values()) == {last}
        assert rows(warehouse, "users") == recomputed_users(warehouse, events)


def test_users_equal_a_recomputation_after_batches_in_any_order_and_replays(
    case: str, tmp_path: Path
) -> None:
    events = [e for e in sdk_events(0, 240, users=4) if e["type"] in ("identify", "group")]
    for n, event in enumerate(events):  # traits that come and go, and ties on the time
        if n % 4 == 0:
            event["traits"] = {"plan": f"p{n}", "seats": n}
        if n % 5 == 0:
            event["timestamp"] = "2026-03-01T10:00:00.000Z"
    chunks = [events[n::4] for n in range(4)]
    found = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        with lake_url(case, tmp_path / str(order[0])) as url, Warehouse.open(url) as warehouse:
            for batch, chunk in enumerate(order):
                warehouse.write(chunks[chunk], Marker("q1", batch), loaded_at=LOADED)
                warehouse.write(chunks[chunk], Marker("q1", batch), loaded_at=LOADED)  # replay
            assert rows(warehouse, "users") == recomputed_users(warehouse, events)
            found.append(rows(warehouse, "users"))
            assert ids(warehouse)["accounts"] == ["org-0", "org-1", "org-2"]
    assert found[0] == found[1]


def test_every_table_reads_back_in_a_fresh_process_with_its_own_library(
    warehouse: Warehouse,
) -> None:
    events = batch_events(0) + batch_events(1)
    for batch in range(2):
        warehouse.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
    tables = read_back(warehouse)
    assert {name: table["ids"] for name, table in tables.items()} == expected(events)
    types = tables["order_completed"]["types"]
    assert types["revenue"] == "int64" and types["total"] == "double"
    assert types["timestamp"].startswith("timestamp[us")


def test_readers_list_and_read_the_tables(warehouse: Warehouse) -> None:
    assert warehouse.tables() == []
    assert warehouse.committed("q1") == {}
    assert warehouse.read("tracks").num_rows == 0
    warehouse.write(batch_events(0), Marker("q1", 7), loaded_at=LOADED)
    assert warehouse.tables() == sorted(expected(batch_events(0)))
    assert set(warehouse.committed("q1").values()) == {7}
    assert warehouse.read("tracks").num_rows == len(expected(batch_events(0))["tracks"])
    sibling = warehouse.table("tracks")
    assert type(sibling) is type(warehouse.events) and "tracks" in sibling.url


def test_a_sibling_is_the_table_of_that_name_beside_events(tmp_path: Path) -> None:
    from exactly.lake import open_table

    s3 = "delta+s3://bucket/lake/events?AWS_ENDPOINT_URL=http://127.0.0.1:9&AWS_REGION=eu-west-1"
    with open_table(s3) as events:
        tracks = events.sibling("order_completed")
        assert isinstance(tracks, DeltaLakeTable)
        assert tracks.uri == "s3://bucket/lake/order_completed"
        assert tracks.storage_options == {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
            "AWS_REGION": "eu-west-1",
        }
        assert tracks.partition is None and events.partition == "date"
    with open_table(f"delta://{tmp_path / 'lake' / 'events'}") as events:
        assert events.sibling("users").url == f"delta://{tmp_path / 'lake' / 'users'}"
    with open_table(f"iceberg://{tmp_path / 'ice'}?namespace=shop") as events:
        users = events.sibling("users")
        assert isinstance(users, IcebergTable) and users.catalog is events.catalog
        assert (users.namespace, users.name, users.partition) == ("shop", "users", None)
        assert users.url.endswith("namespace=shop&table=users")
        users.close()  # a sibling leaves the shared catalog open
        assert events.siblings() == []


@pytest.mark.parametrize("s3_case", S3_CASES)
def test_the_tables_on_s3(s3_case: str, tmp_path: Path, moto_s3: MotoServer) -> None:
    with lake_url(s3_case, tmp_path, moto_s3) as found, Warehouse.open(found) as warehouse:
        assert warehouse.tables() == []
        for batch in range(2):
            warehouse.write(batch_events(batch), Marker("q1", batch), loaded_at=LOADED)
        outcomes = warehouse.write(batch_events(1), Marker("q1", 1), loaded_at=LOADED)
        assert not any(outcome.committed for outcome in outcomes.values())
        assert ids(warehouse) == expected(batch_events(0) + batch_events(1))
