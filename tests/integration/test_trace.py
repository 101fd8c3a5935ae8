"""``exactly trace`` on real runs: a sqlite log deduplicated by the dedupe job on Spark, counted
by the aggregate job on Spark, and a sqlite JobDB holding delivery attempts."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import orjson
import polars as pl
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from exactly.aggregate import frame, job, open_db
from exactly.aggregate.spec import EVENT_COUNTS
from exactly.cli import app
from exactly.config import Settings
from exactly.dedupe.job import DedupePlan
from exactly.dedupe.job import prepare as prepare_dedupe
from exactly.dedupe.job import run as run_dedupe
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    EXECUTING,
    SUCCEEDED,
    NewJob,
    Transition,
)
from exactly.events import partition_for
from exactly.lake import open_table
from exactly.lake.query import LakePlan
from exactly.lake.query import run as run_lake
from exactly.log import Record, open_log
from exactly.trace import trace

pytestmark = [pytest.mark.spark, pytest.mark.slow]
PARTITIONS = 2
KEPT = "0b7c8e6a-3f5e-4d7e-9a51-4c2a8f9d1e01"
TOO_LONG = "x" * 300  # over the 255 characters a messageId may have: rejected by dedupe


def event(message_id: str, n: int) -> bytes:
    return orjson.dumps(
        {
            "type": "track",
            "event": "Signed Up",
            "messageId": message_id,
            "userId": f"u{n}",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "receivedAt": f"2026-01-01T00:00:{n % 60:02d}.000Z",
            "sourceId": "web",
        }
    )


@pytest.fixture(scope="module")
def pipeline(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Raw with a kept id sent twice, filler, a rejected record; dedupe, aggregate, two jobs."""
    root = tmp_path_factory.mktemp("trace")
    settings = Settings(data_dir=root)
    log_url = settings.log_url
    with open_log(log_url) as log:
        log.create_topic("raw", PARTITIONS)
        records: dict[int, list[Record]] = {}
        ids = [f"filler-{n}" for n in range(200)]
        ids[50] = KEPT
        ids[150] = KEPT  # the client retried: a second copy, later
        for n, message_id in enumerate(ids):
            p = partition_for(message_id, PARTITIONS)
            records.setdefault(p, []).append(Record(event(message_id, n), message_id.encode()))
        for p, batch in records.items():
            log.append("raw", p, batch)
        # written without a key by some other tool: dedupe reads its messageId, too long
        log.append("raw", partition_for(TOO_LONG, PARTITIONS), [Record(event(TOO_LONG, 7))])
    dedupe = DedupePlan(log_url, "rocksdb", root, root / "dedupe", until_caught_up=True)
    with open_log(log_url) as log:
        run_dedupe(spark, dedupe, prepare_dedupe(log, dedupe))
    plan = job.AggregatePlan(
        log_url,
        root / "aggregate",
        (EVENT_COUNTS,),
        until_caught_up=True,
        read_records=50,
        max_records_per_trigger=60,
    )
    with open_db(settings.aggregate_url) as db, open_log(log_url) as log:
        specs = frame.check(spark, plan.tables)
        job.run(spark, plan, db, specs, job.prepare(log, db, plan, specs))
    lake = LakePlan(
        log_url,
        settings.lake_url,
        root / "lake-checkpoint",
        until_caught_up=True,
        read_records=10,
        max_records_per_trigger=20,
    )
    with open_table(lake.table_url) as table:
        run_lake(spark, lake, table)  # the default table: a version per 20 events
    now = time.time()
    with open_jobdb(settings.jobdb_url) as jobdb:
        jobs = [NewJob("web", name, b"{}", KEPT) for name in ("a", "b")]
        jobdb.add(jobs, query_id="route-test", batch_id=0)
        (a, _), (b, _) = sorted(jobdb.jobs_with(KEPT), key=lambda found: found[0].destination)
        jobdb.record(
            [
                Transition(a.id, EXECUTING, 1, now),
                Transition(a.id, AWAITING_RETRY, 1, now + 0.25, now + 5, 503, "http", "busy"),
                Transition(a.id, EXECUTING, 2, now + 5),
                Transition(a.id, SUCCEEDED, 2, now + 5.04, None, 200),
                Transition(b.id, EXECUTING, 1, now),
            ]
        )
    yield settings


def test_a_kept_id_names_its_events_offset_batch_and_attempts(pipeline: Settings) -> None:
    found = trace(pipeline, KEPT)
    assert found.found
    first, _ = found.copies
    assert first.verdict.outcome == "kept"
    assert first.source == "web" and first.received_at == "2026-01-01T00:00:50.000Z"
    with open_log(pipeline.log_url) as log:
        (stored,) = log.read(
            "events", first.partition, first.verdict.events_offset or 0, max_records=1
        )
    assert stored.key == KEPT.encode()
    assert found.counted and found.counted[0].batch_id is not None
    with open_db(pipeline.aggregate_url) as db:
        markers = {m.batch_id: m for m in db.markers("events")}
    batch = found.counted[0].batch_id
    offset = first.verdict.events_offset or 0
    assert (markers[batch].end_offsets or {}).get(first.partition, 0) > offset
    if batch - 1 in markers:
        assert (markers[batch - 1].end_offsets or {}).get(first.partition, 0) <= offset
    by_destination = {d.destination: d for d in found.deliveries}
    assert by_destination["a"].state == SUCCEEDED
    assert [(t.state, t.status_code) for t in by_destination["a"].attempts] == [
        (AWAITING_RETRY, 503),
        (SUCCEEDED, 200),
    ]
    assert by_destination["a"].attempts[1].latency_ms == pytest.approx(40, abs=1)
    assert by_destination["b"].state == EXECUTING


def test_a_kept_id_names_the_lake_version_that_landed_it(pipeline: Settings) -> None:
    landed, *tables = trace(pipeline, KEPT).lake
    assert landed.landed and landed.exact and landed.where == "delta lake/events"
    assert landed.version is not None and landed.version > 0

    def holds(name: str, version: int) -> bool:  # read by deltalake and polars, not by exactly
        table = DeltaTable(str(pipeline.data_dir / "lake" / name), version=version)
        key = "messageId" if name == "events" else "id"
        return KEPT in pl.from_arrow(table.to_pyarrow_table())[key].to_list()

    assert holds("events", landed.version) and not holds("events", landed.version - 1)
    # the segment layout (the default): its tables and the versions that hold the message
    assert [table.name for table in tables] == ["tracks", "signed_up"]
    for table in tables:
        assert table.landed and table.exact and table.version is not None, table
        assert holds(table.name, table.version), table
        assert table.version == 0 or not holds(table.name, table.version - 1), table


def test_a_duplicate_names_the_kept_copy(pipeline: Settings) -> None:
    first, second = trace(pipeline, KEPT).copies
    assert second.offset > first.offset
    assert second.verdict.outcome == "duplicate"
    assert second.verdict.duplicate_of == first.offset


def test_a_rejected_record_says_why(pipeline: Settings) -> None:
    (copy,) = trace(pipeline, TOO_LONG).copies
    assert copy.verdict.outcome == "rejected"
    assert "longer than 255" in (copy.verdict.reason or "")


def test_the_cli_prints_every_hop_in_80_columns_and_json(pipeline: Settings) -> None:
    runner = CliRunner()
    args = ["--data-dir", str(pipeline.data_dir), "trace", KEPT]
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "kept -> events" in shown.output and "duplicate of raw" in shown.output
    assert "503" in shown.output and "200" in shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= 80
    as_json = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert as_json["found"] and len(as_json["copies"]) == 2


def test_an_unknown_id_says_so_in_one_line(pipeline: Settings) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["--data-dir", str(pipeline.data_dir), "trace", "no-such-id"])
    assert shown.exit_code == 1
    assert shown.output.count("\n") == 1 and "unknown messageId" in shown.output
    assert not trace(pipeline, "no-such-id").found
