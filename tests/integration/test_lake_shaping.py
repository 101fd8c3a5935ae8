"""The segment layout shaped on the executors (``exactly.lake.shaping``) writes the tables the
driver's shaping writes from the same micro-batches, on Delta: every table's columns and rows
(but ``uuid_ts``, the clock of each run), a replay included, and a new column whose kind the
two partitions of a batch would decide apart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest

from exactly.events import partition_for
from exactly.lake import open_table, shaping
from exactly.lake.query import LakePlan, Progress, run
from exactly.lake.warehouse import Warehouse
from exactly.log import open_log
from tests.aggregate_stream import append
from tests.integration.test_lake_segment import forget_last_commit
from tests.warehouse_checks import expected
from tests.warehouse_events import sdk_events

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 2


def split_kinds(count: int) -> list[dict[str, Any]]:
    """``Cart Updated`` tracks whose ``amount`` is an integer in partition 0 and has a fraction
    in partition 1: each task alone would make it bigint, or double; the batch, double."""
    found, n = [], 0
    while len(found) < count:
        message_id = f"cart-{n}"
        n += 1
        fraction = partition_for(message_id, PARTITIONS) == 1
        found.append(
            {
                **sdk_events(n, 1)[0],
                "type": "track",
                "messageId": message_id,
                "event": "Cart Updated",
                "properties": {"amount": n + 0.25 if fraction else n, "items": [n]},
            }
        )
    return found


def land(spark: SparkSession, log_url: str, where: Path, shaping_on: str) -> Progress:
    plan = LakePlan(
        log_url,
        f"delta://{where / 'events'}",
        where / "checkpoint",
        until_caught_up=True,
        max_records_per_trigger=250,
        read_records=250,
        layout="segment",
        shaping=shaping_on,
    )
    with open_table(plan.table_url) as table:
        return run(spark, plan, table)


def tables(where: Path) -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    """Each table's schema and its rows by id, ``uuid_ts`` apart."""
    found = {}
    with Warehouse.open(f"delta://{where / 'events'}") as warehouse:
        for name in warehouse.tables():
            read = warehouse.read(name)
            rows = [{k: v for k, v in row.items() if k != "uuid_ts"} for row in read.to_pylist()]
            found[name] = (read.schema, sorted(rows, key=lambda row: row["id"]))
    return found


@pytest.mark.spark
@pytest.mark.slow
def test_executors_shape_what_the_driver_shapes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from exactly.spark import session

    # a task per core even for these small batches: parts typed apart need several tasks
    monkeypatch.setattr(session, "READ_TASK_RECORDS", 1)
    log_url = f"sqlite://{tmp_path / 'log'}"
    events = sdk_events(0, 300) + split_kinds(40)
    runs: list[int] = []
    settle = shaping.shape_in_parts

    def counted(job: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        runs.append(0)

        def again(decided: Any) -> Any:
            runs[-1] += 1
            return job(decided)

        return settle(again, *args, **kwargs)

    monkeypatch.setattr(shaping, "shape_in_parts", counted)
    with open_log(log_url) as log:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, [(e["messageId"], orjson.dumps(e)) for e in events])
        on_executors = land(spark, log_url, tmp_path / "executors", "executors")
        assert on_executors.events == len(events) and len(on_executors.batches) >= 2
        on_driver = land(spark, log_url, tmp_path / "driver", "driver")
        assert on_driver.batches == on_executors.batches
        assert len(runs) == len(on_executors.batches)
        assert 2 in runs  # a batch whose parts typed `amount` apart was retyped
        forget_last_commit(tmp_path / "executors" / "checkpoint")
        assert land(spark, log_url, tmp_path / "executors", "executors").replays == 1
    found, truth = tables(tmp_path / "executors"), tables(tmp_path / "driver")
    assert sorted(found) == sorted(truth) == sorted(expected(events))
    for name, (schema, rows) in truth.items():
        assert found[name][0] == schema, name
        assert found[name][1] == rows, name
        assert sorted(str(row["id"]) for row in rows) == expected(events)[name], name
    amounts = dict(zip(found["cart_updated"][0].names, found["cart_updated"][0].types, strict=True))
    assert str(amounts["amount"]) == "double"
    with Warehouse.open(f"delta://{tmp_path / 'executors' / 'events'}") as warehouse:
        stamps = set(warehouse.read("tracks").column("uuid_ts").to_pylist())
    assert len(stamps) == len(on_executors.batches)  # one uuid_ts per batch
