"""The lake query through Spark: every event of ``events`` in the table once, replays skipped,
and the rows the same as :func:`exactly.lake.columns.event_rows` builds in Python."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from exactly.lake import BACKENDS, LakeTable, Marker, open_table
from exactly.lake.audit import audit_lake, render
from exactly.lake.columns import event_rows, promoted_columns
from exactly.lake.files import FILE_NAME
from exactly.lake.query import LakePlan, Progress, run, starting_offsets
from exactly.log import open_log
from tests.aggregate_stream import EventStream, append
from tests.lake_tables import lake_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 3
COLUMNS = promoted_columns(
    {"revenue": "properties.revenue double", "seats": "properties.seats bigint"}
)


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with lake_url(request.param, tmp_path) as found:
        yield found


def land(spark: SparkSession, log_url: str, table: LakeTable, checkpoint: Path) -> Progress:
    """One run of the query until caught up, as ``exactly lake --until-caught-up``."""
    plan = LakePlan(
        log_url,
        table.url,
        checkpoint,
        COLUMNS,
        until_caught_up=True,
        max_records_per_trigger=700,
        read_records=500,
    )
    return run(spark, plan, table)


def normalised(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for row in rows:
        for name, value in row.items():
            if isinstance(value, datetime):
                row[name] = value.astimezone(UTC)
        found[row["messageId"]] = row
    return found


@pytest.mark.spark
def test_each_event_lands_once_and_a_replay_commits_nothing(
    spark: SparkSession, url: str, tmp_path: Path
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    checkpoint = tmp_path / "checkpoint"
    stream = EventStream(seed=5, duplicate_rate=0)
    records = list(stream.chunk(2300))
    with open_log(log_url) as log, open_table(url) as table:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, records[:1500])
        first = land(spark, log_url, table, checkpoint)
        assert first.events == 1500 and first.replays == 0
        # the last batch replayed: its commit in the checkpoint lost, as after a crash there
        last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
        (checkpoint / "commits" / str(last)).unlink()
        (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
        append(log, "events", PARTITIONS, records[1500:2000])
        second = land(spark, log_url, table, checkpoint)
        assert second.replays == 1 and second.events == 500
        # a new checkpoint over the filled table starts where the table's newest batch ended
        append(log, "events", PARTITIONS, records[2000:])
        plan = LakePlan(log_url, table.url, tmp_path / "new", COLUMNS, until_caught_up=True)
        assert starting_offsets(table, plan) != "earliest"
        third = run(spark, plan, table, start=starting_offsets(table, plan))
        assert third.events == 300
        read = table.read()
        ids = read.column("messageId").to_pylist()
        assert sorted(ids) == sorted(message_id for message_id, _ in records)
        # the rows as the Python builder makes them from the same JSON
        names = [*event_rows([]).column_names, "revenue", "seats"]
        found = normalised(read.select(names).to_pylist())
        truth = normalised(event_rows([value for _, value in records], COLUMNS).to_pylist())
        for message_id, expected in truth.items():
            row = found[message_id]
            for name in ("properties", "traits", "context"):  # the same JSON, maybe spaced
                assert _json(row.pop(name)) == _json(expected.pop(name)), (message_id, name)
            assert row == expected, message_id
    if url.startswith("delta://"):  # the executors wrote the files, named by their batch
        batches = {int(match["batch"]) for match in written(url.removeprefix("delta://"))}
        assert len(batches) > 3


def written(path: str) -> list[re.Match[str]]:
    """The names of a Delta table's files as :data:`FILE_NAME` matches them: all must."""
    from deltalake import DeltaTable

    paths = pa.table(DeltaTable(path).get_add_actions(flatten=True)).column("path").to_pylist()
    names = [file.rsplit("/", 1)[-1] for file in paths]
    matches = [FILE_NAME.match(name) for name in names]
    assert all(matches), names
    return [match for match in matches if match]


@pytest.mark.spark
def test_a_batch_is_a_file_per_task_and_day(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    from exactly.spark import session

    # a task per core even for this small batch (the jobs give one task to fewer than 5,000)
    monkeypatch.setattr(session, "READ_TASK_RECORDS", 1)
    log_url = f"sqlite://{tmp_path / 'log'}"
    records = list(EventStream(seed=8, minutes=3 * 24 * 60, duplicate_rate=0).chunk(600))
    path = tmp_path / "lake" / "events"
    with open_log(log_url) as log, open_table(f"delta://{path}") as table:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, records)
        assert land(spark, log_url, table, tmp_path / "checkpoint").batches == {0: (600, True)}
    assert {int(match["batch"]) for match in written(str(path))} == {0}
    added = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    days = {action["partition.date"] for action in added}
    assert len(added) > len(days) >= 3  # a day's rows from more than one task: a file each
    assert sum(action["num_records"] for action in added) == 600


def _json(text: str | None) -> Any:
    import json

    return None if text is None else json.loads(text)


@pytest.mark.spark
def test_a_delta_table_reads_back_in_polars_and_duckdb(spark: SparkSession, tmp_path: Path) -> None:
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=6, duplicate_rate=0)
    records = list(stream.chunk(1000))
    path = tmp_path / "lake" / "events"
    with open_log(log_url) as log, open_table(f"delta://{path}") as table:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, records)
        land(spark, log_url, table, tmp_path / "checkpoint")
    frame = pl.read_delta(str(path))
    assert frame.height == 1000 and frame["messageId"].n_unique() == 1000
    dataset = DeltaTable(str(path)).to_pyarrow_dataset()
    connection = duckdb.connect()
    connection.register("events", dataset)
    counted = connection.sql("select count(distinct messageId) from events").fetchall()
    assert counted == [(1000,)]


@pytest.mark.spark
def test_the_audit_recounts_the_lake_per_day(spark: SparkSession, tmp_path: Path) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    records = list(EventStream(seed=7, duplicate_rate=0).chunk(1200))
    with open_log(log_url) as log, open_table(f"delta://{tmp_path / 'lake'}") as table:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, records[:900])
        land(spark, log_url, table, tmp_path / "checkpoint")
        append(log, "events", PARTITIONS, records[900:])  # not landed yet: not a difference
        audited = audit_lake(spark, log_url, "events", table)
        assert audited.exact and audited.events == 900, audited.differences
        assert sum(recount for _, recount in audited.days.values()) == 900
        assert render(audited)[-1] == "lake audit: exact"
        # three events landed twice, by a writer that is not the query: found, on their day
        again = event_rows([value for _, value in records[:3]])
        assert table.append(again, Marker("someone-else", 0))
        audited = audit_lake(spark, log_url, "events", table)
        ((day, (lake, recount)),) = audited.differences.items()
        assert lake == (recount + 3, recount) and day == again.column("date")[0].as_py()
        shown = render(audited)
        assert shown[-1] == "lake audit: DIFFERENCES FOUND"
        assert f"  {day}: lake {recount + 3:,} rows of {recount:,} messageIds" in shown[-2]
