"""``exactly audit`` recounts each table of the segment layout against ``events`` up to that
table's own end offsets: rows and distinct ids per day, ``users`` against the distinct user ids
of the identifies, ``accounts`` against the group ids of the groups (a Spark batch read).

The batches land as the lake query lands them (tests/integration/test_warehouse_readers.py's
``land``) on Delta, Iceberg and PostgreSQL; the log is a sqlite log with one partition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from exactly.lake import Marker
from exactly.lake.audit import audit_lake, render
from exactly.lake.segment import day_of
from exactly.lake.warehouse import Warehouse
from exactly.log import Record, open_log
from tests.integration.test_warehouse_readers import land
from tests.lake_tables import lake_url
from tests.warehouse_child import LOADED
from tests.warehouse_events import sdk_event, sdk_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(params=("delta", "iceberg", "postgresql"))
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with lake_url(str(request.param), tmp_path) as found:
        yield found


@pytest.mark.spark
@pytest.mark.slow
def test_the_audit_recounts_each_table_up_to_its_own_end_offsets(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    # the second batch has no product viewed, page, screen or group: those tables end at 40;
    # the last 16 events are in the log but not landed yet
    later = [
        e
        for e in sdk_events(40, 40)
        if e["type"] in ("identify", "alias") or e.get("event") == "Order Completed"
    ]
    events = [*sdk_events(0, 40), *later, *sdk_events(200, 16)]
    for event in events[::5]:  # a day of their own: a row on the wrong day would show
        event["timestamp"] = "2026-02-27T23:59:59.999Z"
    with open_log(log_url) as log, Warehouse.open(url) as warehouse:
        log.create_topic("events", 1)
        log.append("events", 0, [Record(orjson.dumps(e), e["messageId"].encode()) for e in events])
        land(warehouse, [events[:40], events[40 : 40 + len(later)]])
        audited = audit_lake(spark, log_url, "events", warehouse.events, warehouse)
        assert audited.exact, (audited.differences, [t.differences for t in audited.tables or ()])
        assert audited.events == 40 + len(later)
        tables = {t.name: t for t in audited.tables or ()}
        assert sorted(tables) == sorted(warehouse.tables()) and len(tables) == 10
        landed = events[:40] + later
        tracks = [e for e in landed if e["type"] == "track"]
        assert tables["tracks"].events == len(tracks)
        assert tables["tracks"].days == {
            day: ((n, n), n) for day, n in Counter(day_of(e) for e in tracks).items()
        }
        assert len(tables["tracks"].days) == 2
        assert tables["pages"].end_offsets == {0: 40}
        assert tables["pages"].events == sum(e["type"] == "page" for e in events[:40])
        users = {e["userId"] for e in landed if e["type"] == "identify"}
        assert tables["users"].days == {None: ((len(users), len(users)), len(users))}
        groups = {e["groupId"] for e in events[:40] if e["type"] == "group"}
        assert tables["accounts"].days == {None: ((len(groups), len(groups)), len(groups))}
        assert render(audited)[-1] == "lake audit: exact"

        # an order written twice and a user no identify in the log has, by another writer
        order = next(e for e in landed if e.get("event") == "Order Completed")
        stranger = {**sdk_event(2), "messageId": "stranger", "userId": "stranger"}
        warehouse.write([order, stranger], Marker("someone-else", 0), loaded_at=LOADED)
        audited = audit_lake(spark, log_url, "events", warehouse.events, warehouse)
        assert not audited.exact and not audited.differences  # the events table is right
        differ = {t.name: t.differences for t in audited.tables or () if t.differences}
        day = day_of(order)
        n = Counter(day_of(e) for e in tracks)[day]
        assert differ["tracks"] == {day: ((n + 1, n), n)}
        assert set(differ) == {"tracks", "order_completed", "identifies", "users"}
        assert differ["users"] == {None: ((len(users) + 1, len(users) + 1), len(users))}
        shown = render(audited)
        assert shown[-1] == "lake audit: DIFFERENCES FOUND"
        assert "  segment layout: 10 tables, each up to its own end offsets, 4 differ" in shown
        assert f"  tracks {day}: lake {n + 1:,} rows of {n:,} ids, recount {n:,} events" in shown
        assert max(len(line) for line in shown if warehouse.events.url not in line) <= 80, shown
