"""What reads the lake sees the segment layout's tables: ``exactly lake sql`` by name, ``exactly
status`` with each table's lag and rejected values, ``exactly trace`` with the tables and versions
that hold a message (the Spark audit: test_warehouse_audit.py).

Real backends (tests/lake_tables.py): Delta and Iceberg on local directories, Iceberg with its
catalog in PostgreSQL, PostgreSQL. Each batch lands as the lake query lands it: the events table,
then every table of the layout, with the batch's marker and end offsets (one partition: the
``n``th event is at offset ``n``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
import pytest

from exactly.cli import main
from exactly.config import Settings
from exactly.errors import LakeError
from exactly.lake import Marker
from exactly.lake.columns import event_rows
from exactly.lake.sql import named, query
from exactly.lake.status import TableStatus, render, table_statuses
from exactly.lake.warehouse import Warehouse
from exactly.trace import Trace, _landed
from exactly.trace import render as render_trace
from tests.lake_tables import lake_url
from tests.warehouse_child import LOADED
from tests.warehouse_events import sdk_event, sdk_events

CASES = ("delta", "iceberg", "iceberg+postgresql", "postgresql")


@pytest.fixture(params=CASES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with lake_url(str(request.param), tmp_path) as found:
        yield found


@pytest.fixture
def warehouse(url: str) -> Iterator[Warehouse]:
    with Warehouse.open(url) as opened:
        yield opened


def land(warehouse: Warehouse, batches: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each batch into the events table and the layout's tables, as the lake query lands it;
    every event in order, the ``n``th at offset ``n`` of partition 0."""
    landed: list[dict[str, Any]] = []
    for batch_id, events in enumerate(batches):
        landed += events
        marker = Marker("q1", batch_id, {0: len(landed)})
        values = [orjson.dumps(event) for event in events]
        assert warehouse.events.append(event_rows(values), marker)
        warehouse.write(events, marker, loaded_at=LOADED)
    return landed


def orders(events: Sequence[dict[str, Any]]) -> list[str]:
    return [e["messageId"] for e in events if e.get("event") == "Order Completed"]


def scalar(table: Any) -> Any:
    (row,) = table.to_pylist()
    (value,) = row.values()
    return value


# -- exactly lake sql -----------------------------------------------------------------------------


def test_lake_sql_reads_each_table_by_its_name(warehouse: Warehouse) -> None:
    events = land(warehouse, [sdk_events(0, 40)])
    events_table = warehouse.events
    ordered = orders(events)
    assert len(ordered) > 5
    text = "select count(*) as n from order_completed"
    assert scalar(query(events_table, text, siblings=True)) == len(ordered)
    joined = (
        "select count(*) from tracks t join Order_Completed o on t.id = o.id"
        " join events e on e.messageId = o.id where t.event = 'order_completed'"
    )
    assert scalar(query(events_table, joined, siblings=True)) == len(ordered)
    revenue = "select sum(revenue) from order_completed"
    want = sum(e["properties"]["revenue"] for e in events if e.get("event") == "Order Completed")
    assert scalar(query(events_table, revenue, siblings=True)) == want
    users = "select count(*) from users u join identifies i on i.user_id = u.id"
    identifies = [e for e in events if e["type"] == "identify"]
    assert scalar(query(events_table, users, siblings=True)) == len(identifies)
    assert scalar(query(events_table, "select count(*) from events", siblings=True)) == 40
    with pytest.raises(LakeError, match="order_completed"):
        query(events_table, text)  # the events layout: events alone


def test_only_the_tables_a_query_names_are_registered() -> None:
    text = "with recent as (select 1) select * from recent, tracks join main.Users u on true"
    assert named(text) == {"tracks", "users"}
    assert named("select from where") == set()  # DuckDB says what is wrong when it runs


# -- exactly status -------------------------------------------------------------------------------


def test_status_lists_each_table_its_rows_lag_and_rejected_values(warehouse: Warehouse) -> None:
    first = sdk_events(0, 40)
    free = {**sdk_event(41), "messageId": "free"}  # an Order Completed
    free["properties"] = {**free["properties"], "revenue": "free", "total": "n/a"}
    assert free["event"] == "Order Completed"
    later = [free, *(e for e in sdk_events(100, 40) if e["type"] == "identify")]
    events = land(warehouse, [first, later])
    ends = warehouse.events.end_offsets()
    assert ends == {0: len(events)}
    found = {status.name: status for status in table_statuses(warehouse, ends)}
    assert sorted(found) == sorted(warehouse.tables())
    assert found["order_completed"].rows == len(orders(events))
    assert found["identifies"].rows == sum(e["type"] == "identify" for e in events)
    assert found["users"].rows == 5
    # tables the second batch wrote are level with events; the others are behind by it
    for name in ("tracks", "order_completed", "identifies", "users"):
        assert (found[name].landed, found[name].behind) == (len(events), 0), name
    for name in ("product_viewed", "pages", "screens", "groups", "aliases", "accounts"):
        assert (found[name].landed, found[name].behind) == (40, len(later)), name
    assert found["order_completed"].rejected == {"revenue": 1, "total": 1}
    assert all(not s.rejected for name, s in found.items() if name != "order_completed")
    postgres = warehouse.events.version() is None
    assert all((s.version is None) == postgres for s in found.values())
    if not postgres:
        assert all(s.version == warehouse.table(s.name).version() for s in found.values())


def test_status_counts_the_events_of_names_past_the_table_limit(url: str, tmp_path: Path) -> None:
    from exactly.lake.segment import Limits
    from exactly.lake.status import collect
    from exactly.log import open_log

    with (
        Warehouse.open(url, limits=Limits(tables=1)) as warehouse,
        open_log(f"sqlite://{tmp_path / 'log'}") as log,
    ):
        events = land(warehouse, [sdk_events(0, 40)])
        viewed = sum(e.get("event") == "Product Viewed" for e in events)
        assert "product_viewed" not in warehouse.tables() and viewed  # fewer than orders
        log.create_topic("events", 1)
        found = collect(warehouse.events, log, warehouse=warehouse)
        assert found.held_back == {"product_viewed": viewed}
        text = render(found, tmp_path)
        assert f"  past [lake] max_tables: {viewed} events of 1 name in tracks alone: " in text
        assert "product_viewed" in text and found.lag == 0
        with Warehouse.open(url) as roomy:  # the default limit: nothing read, nothing held
            assert collect(roomy.events, log, warehouse=roomy).held_back == {}


def test_status_shows_the_top_tables_and_columns_in_80_columns_and_json_has_all() -> None:
    from exactly.lake.status import LakeStatus

    tables = [
        TableStatus(
            f"event_number_{n:03d}_with_a_rather_long_name",
            9_223_372_036_854_775_000 + n,  # an Iceberg snapshot id
            1_000_000 * n,
            n,
            300 - n,
            {f"column_{n}_{'x' * 70}": n, "revenue": 1} if n % 2 else {},
        )
        for n in range(300)
    ]
    status = LakeStatus("delta://lake/events", 3, 300, 0, "segment", tables)
    text = render(status, Path("/nowhere"))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    assert "  segment layout: 300 tables, 44,850,000,000 rows" in lines
    assert "    ... and 290 more tables (--json: every one)" in lines
    shown = [line for line in lines if line.startswith("    event_number_")]
    assert [line.split()[-1] for line in shown[:10]] == [str(300 - n) for n in range(10)]
    assert "  values kept in _rejected: 22,650 in 300 columns" in lines
    top = [line for line in lines if line.startswith("    event_number_299")]
    assert top and top[-1].split()[-1] == "299"  # the column with the most rejects first
    assert "    ... and 290 more columns (--json: every one)" in lines
    assert len(json.loads(json.dumps(asdict(status)))["tables"]) == 300


def test_status_and_lake_sql_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"delta://{tmp_path / 'lake' / 'events'}"
    monkeypatch.setenv("EXACTLY_LAKE__URL", url)
    monkeypatch.setenv("EXACTLY_LAKE__LAYOUT", "segment")
    with Warehouse.open(url) as warehouse:
        events = land(warehouse, [sdk_events(0, 40)])
    with pytest.raises(SystemExit) as exit_:
        main(["lake", "sql", "select count(*) as n from order_completed"])
    assert exit_.value.code in (0, None)
    assert capsys.readouterr().out.splitlines()[2].split() == [str(len(orders(events)))]
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--json"])
    report = json.loads(capsys.readouterr().out)["lake"]
    assert report["layout"] == "segment"
    tables = {t["name"]: t for t in report["tables"]}
    assert tables["order_completed"]["rows"] == len(orders(events))
    assert tables["tracks"]["behind"] == 0 and tables["tracks"]["version"] == 0
    with pytest.raises(SystemExit) as exit_:
        main(["status"])
    out = capsys.readouterr().out
    assert "segment layout: 10 tables" in out
    assert max(len(line) for line in out.splitlines() if str(tmp_path) not in line) <= 80


# -- exactly trace --------------------------------------------------------------------------------


def test_trace_names_the_tables_and_versions_that_hold_the_message(
    url: str, tmp_path: Path
) -> None:
    with Warehouse.open(url) as warehouse:
        events = land(warehouse, [sdk_events(0, 16), sdk_events(16, 16), sdk_events(32, 16)])
        settings = Settings(data_dir=tmp_path, lake={"url": url, "layout": "segment"})
        order = next(
            n for n, e in enumerate(events) if n >= 16 and e.get("event") == "Order Completed"
        )
        identify = next(n for n, e in enumerate(events) if n >= 32 and e["type"] == "identify")
        user = events[identify]["userId"]
        for offset, want in (
            (order, [("events", None), ("tracks", None), ("order_completed", None)]),
            (identify, [("events", None), ("identifies", None), ("users", user)]),
        ):
            message_id = events[offset]["messageId"]
            result = Trace(message_id)
            _landed(settings, [(0, offset)], result, {(0, offset): orjson.dumps(events[offset])})
            assert [(landed.name, landed.key) for landed in result.lake] == want
            assert not result.notes
            for landed in result.lake:
                assert landed.landed and landed.exact, landed
                table = (
                    warehouse.events if landed.name == "events" else warehouse.table(landed.name)
                )
                key = "messageId" if landed.name == "events" else "id"
                wanted = landed.key or message_id
                if landed.version is None:  # PostgreSQL: no versions
                    assert table.version() is None
                    continue
                # read by the table's own library: the version holds it, the one before not
                before, at = ids_around(table, landed.version, key)
                assert wanted in at and wanted not in before, landed
            shown = render_trace(result).splitlines()
            assert max(len(line) for line in shown) <= 80
            for landed in result.lake[1:]:
                row = "" if landed.key is None else f" (row {landed.key})"
                how = "landed (the table keeps no versions)"
                if landed.version is not None:
                    how = f"version {landed.version}"
                assert f"  {landed.name}{row}: {how}" in shown, shown
        result = Trace("x")
        _landed(settings, [(0, 10**6)], result, {(0, 10**6): orjson.dumps(events[order])})
        assert [landed.landed for landed in result.lake] == [False, False, False]


def ids_around(table: Any, version: int, key: str) -> tuple[set[Any], set[Any]]:
    """The ``key`` values of ``table`` before ``version`` and at it, read by deltalake or
    pyiceberg."""
    from deltalake import DeltaTable

    if table.url.startswith("delta"):
        at = DeltaTable(table.uri, version=version).to_pyarrow_table(columns=[key])
        before = set()
        if version > 0:
            older = DeltaTable(table.uri, version=version - 1).to_pyarrow_table(columns=[key])
            before = set(older.column(key).to_pylist())
        return before, set(at.column(key).to_pylist())
    found = table._table()
    snapshot = found.snapshot_by_id(version)
    at = found.scan(snapshot_id=version).to_arrow().column(key).to_pylist()
    parent = snapshot.parent_snapshot_id
    before = [] if parent is None else found.scan(snapshot_id=parent).to_arrow().column(key)
    return set(before if isinstance(before, list) else before.to_pylist()), set(at)


# -- the console ----------------------------------------------------------------------------------


def test_the_console_state_lists_the_tables_read_at_most_every_few_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exactly.console import state

    url = f"delta://{tmp_path / 'lake' / 'events'}"
    with Warehouse.open(url) as warehouse:
        events = land(warehouse, [sdk_events(0, 40)])
    settings = Settings(data_dir=tmp_path, lake={"url": url, "layout": "segment"})
    reader = state.Reader(settings)
    problems: list[str] = []
    try:
        found = reader._lake_entry(problems)
        assert found is not None and not problems
        tables = {t["name"]: t for t in found["tables"]}
        assert tables["order_completed"]["rows"] == len(orders(events))
        assert found["landed"] == 40 and found["layout"] == "segment"
        json.dumps(found)  # JSON as it is served
        with Warehouse.open(url) as warehouse:
            land_more = [{**sdk_event(41), "messageId": "more"}]
            warehouse.write(land_more, Marker("q1", 1, {0: 41}), loaded_at=LOADED)
        assert reader._lake_entry(problems) is found  # read again only after LAKE_EVERY
        later = time.time() + state.LAKE_EVERY + 1
        monkeypatch.setattr(state.time, "time", lambda: later)
        again = reader._lake_entry(problems)
        assert again is not found and again is not None
        tables = {t["name"]: t for t in again["tables"]}
        assert tables["order_completed"]["rows"] == len(orders(events)) + 1
    finally:
        reader.close()
