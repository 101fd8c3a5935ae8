"""The lake query with ``layout = "segment"``: Segment's tables beside ``events`` through Spark,
each id once in each table after replays, and after a run killed between the events table and
the others (the events table has the batch, Segment's tables do not)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from exactly.lake import BACKENDS, open_table
from exactly.lake.query import LakePlan, Progress, run
from exactly.lake.warehouse import Warehouse
from exactly.log import open_log
from tests.aggregate_stream import append
from tests.lake_tables import lake_url
from tests.warehouse_events import sdk_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 2


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with lake_url(request.param, tmp_path) as found:
        yield found


def land(
    spark: SparkSession, log_url: str, table_url: str, checkpoint: Path, layout: str
) -> Progress:
    plan = LakePlan(
        log_url,
        table_url,
        checkpoint,
        until_caught_up=True,
        max_records_per_trigger=40,
        read_records=40,
        layout=layout,
    )
    with open_table(table_url) as table:
        return run(spark, plan, table)


def forget_last_commit(checkpoint: Path) -> None:
    """The last batch's commit lost, as after a kill: the next run replays it."""
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    (checkpoint / "commits" / str(last)).unlink()
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)


def ids(warehouse: Warehouse, name: str) -> Counter[str]:
    return Counter(str(i) for i in warehouse.read(name).column("id").to_pylist())


@pytest.mark.spark
def test_segment_tables_hold_each_event_once_through_replays_and_a_cut(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    checkpoint = tmp_path / "checkpoint"
    events = sdk_events(0, 160)
    records = [(str(e["messageId"]), orjson.dumps(e)) for e in events]
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, records[:100])
        first = land(spark, log_url, url, checkpoint, "segment")
        assert first.events == 100 and first.replays == 0
        forget_last_commit(checkpoint)  # replayed: no table takes it twice
        assert land(spark, log_url, url, checkpoint, "segment").replays == 1
        # killed between the tables: the events table has the next batch, Segment's do not
        append(log, "events", PARTITIONS, records[100:])
        assert land(spark, log_url, url, checkpoint, "events").events == 60
        forget_last_commit(checkpoint)
        assert land(spark, log_url, url, checkpoint, "segment").replays == 1
    landed = {str(e["messageId"]) for e in events[:100]}
    with Warehouse.open(url) as warehouse:
        tables = set(warehouse.tables())
        assert {"tracks", "order_completed", "identifies", "pages", "screens"} <= tables
        assert {"groups", "aliases", "users", "accounts"} <= tables
        tracks = ids(warehouse, "tracks")
        assert max(tracks.values()) == 1  # each id once, replays and the cut included
        expected = {str(e["messageId"]) for e in events if e["type"] == "track"}
        # every batch the segment layout ran reached the tables; the one run with "events"
        # alone reached them when it was replayed, its last batch: the ids of the batches
        # before it (with layout "events") are in events only
        assert set(tracks) <= expected
        assert {i for i in expected if i in landed} <= set(tracks)
        # the batch cut after the events table reached Segment's tables when replayed
        assert any(int(i.rsplit("-", 1)[1]) >= 100 for i in tracks), sorted(tracks)
        for name in ("identifies", "pages", "screens", "groups", "aliases", "order_completed"):
            assert max(ids(warehouse, name).values()) == 1, name
        orders = warehouse.read("order_completed")
        assert {"order_id", "total", "revenue", "shipping_method", "products"} <= set(
            orders.column_names
        )
        users = set(warehouse.read("users").column("id").to_pylist())
        identified = set(warehouse.read("identifies").column("user_id").to_pylist())
        assert users == identified and len(users) == warehouse.read("users").num_rows
