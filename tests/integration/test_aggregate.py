"""The aggregate job on each backend: exact counts, replays, audits, refusals, outages.

Counts are compared with a recount in plain Python of the distinct events
(``tests/aggregate_stream.py``), not with Spark, so a bug shared by the job and the audit shows.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from exactly.aggregate import AggregateDB, Batch, frame, job, open_db
from exactly.aggregate.audit import compare, render, run_audit
from exactly.aggregate.spec import EVENT_COUNTS, parse_table
from exactly.aggregate.sqlite import BUSY_SECONDS
from exactly.errors import ConfigError
from exactly.log import open_log
from tests.aggregate_db import BACKENDS, Proxy, database, postgres_missing, postgres_schema
from tests.aggregate_stream import (
    PLAN_TABLE,
    EventStream,
    append,
    event_counts,
    plan_counts,
)
from tests.conftest import require

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS = 2
PLANS = parse_table(PLAN_TABLE["name"], PLAN_TABLE["group_by"], PLAN_TABLE["measures"])  # type: ignore[arg-type]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with database(request.param, tmp_path) as url:
        yield url


def count(
    spark: SparkSession,
    log_url: str,
    db: AggregateDB,
    checkpoint: Path,
    on_batch: Any = None,
    **options: Any,
) -> job.Progress:
    """One run of the job until caught up, as ``exactly aggregate --until-caught-up``."""
    plan = job.AggregatePlan(
        log_url,
        checkpoint,
        (EVENT_COUNTS, PLANS),
        until_caught_up=True,
        read_records=500,
        **options,
    )
    specs = frame.check(spark, plan.tables)
    with open_log(log_url) as log:
        start = job.prepare(log, db, plan, specs)
    return job.run(spark, plan, db, specs, start, on_batch)


def assert_exact(db: AggregateDB, events: list[dict[str, Any]]) -> None:
    exact_decimals = db.decimal_type != "REAL"
    for spec, truth in ((EVENT_COUNTS, event_counts(events)), (PLANS, plan_counts(events))):
        typed = frame_spec(spec)
        differences = compare(typed, db.table_rows(typed), truth, exact_decimals)
        assert not differences, f"{spec.name}: {differences[:5]} ({len(differences)} differ)"


def frame_spec(spec: Any) -> Any:
    if spec.name == PLANS.name:  # seats: a sum of integers, as Spark resolves it
        return PLANS.typed({"plan": "other", "hour": "time", "events": "other", "seats": "integer"})
    return spec


def distinct_raw(stream: EventStream, count: int) -> list[tuple[str, bytes]]:
    """What dedupe would pass: the first record of each messageId."""
    seen: set[str] = set()
    out = []
    for message_id, value in stream.chunk(count):
        if message_id not in seen:
            seen.add(message_id)
            out.append((message_id, value))
    return out


@pytest.mark.spark
def test_raw_with_duplicates_through_dedupe_counts_each_event_once(
    spark: SparkSession, db_url: str, tmp_path: Path
) -> None:
    from exactly.dedupe.job import DedupePlan
    from exactly.dedupe.job import prepare as prepare_dedupe
    from exactly.dedupe.job import run as run_dedupe

    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=3)
    dedupe = DedupePlan(
        log_url, "rocksdb", tmp_path / "data", tmp_path / "dedupe", until_caught_up=True
    )
    with open_log(log_url) as log, open_db(db_url) as db:
        log.create_topic("raw", PARTITIONS)
        for _ in range(2):  # two rounds: the second resumes both jobs from their checkpoints
            append(log, "raw", PARTITIONS, stream.chunk(6000))
            run_dedupe(spark, dedupe, prepare_dedupe(log, dedupe))
            count(spark, log_url, db, tmp_path / "checkpoint", max_records_per_trigger=2500)
        assert stream.duplicates > 40  # 0.6% of 12,000 raw records
        assert_exact(db, list(stream.events.values()))
        audited = run_audit(spark, log_url, "events", db, frame.check(spark, [EVENT_COUNTS, PLANS]))
        assert audited.exact, render(audited, [EVENT_COUNTS, PLANS])
        assert audited.events == len(stream.events)


@pytest.mark.spark
def test_audit_catches_a_corrupted_row(spark: SparkSession, db_url: str, tmp_path: Path) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=4)
    with open_log(log_url) as log, open_db(db_url) as db:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, distinct_raw(stream, 3000))
        count(spark, log_url, db, tmp_path / "checkpoint")
        specs = frame.check(spark, [EVENT_COUNTS, PLANS])
        assert run_audit(spark, log_url, "events", db, specs).exact
        victim = db.table_rows(EVENT_COUNTS)[7]
        connection = db._connect()
        connection.cursor().execute(
            'UPDATE event_counts SET "count" = "count" + 1 WHERE source = '
            + db.placeholder
            + " AND event = "
            + db.placeholder
            + " AND type = "
            + db.placeholder,
            (victim[0], victim[2], victim[1]),
        )
        connection.commit()
        connection.close()
        result = run_audit(spark, log_url, "events", db, specs)
        assert not result.exact
        assert all(d.table == "event_counts" for d in result.differences)
        lines = render(result, specs)
        assert lines[-1] == "audit: DIFFERENCES FOUND"
        assert any(f"source={victim[0]!r}" in line for line in lines)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replayed_batch_changes_nothing(backend: str, tmp_path: Path) -> None:
    with database(backend, tmp_path) as url, open_db(url) as db:
        db.prepare([EVENT_COUNTS], "cp", fresh=True)
        rows = [("web", "track", "A", "2024-01-01 00:00:00", 3, Decimal("1.500000"))]
        batch = Batch("q", 0, "cp", "events", {0: 3}, {"event_counts": rows}, 3)
        assert db.commit(batch, [EVENT_COUNTS])
        assert not db.commit(batch, [EVENT_COUNTS])  # the marker is there: a replay
        later = Batch("q", 1, "cp", "events", {0: 5}, {"event_counts": rows[:1]}, 2)
        assert db.commit(later, [EVENT_COUNTS])
        assert db.table_rows(EVENT_COUNTS) == [
            ("web", "track", "A", "2024-01-01 00:00:00", 6, Decimal("3.000000"))
        ]
        marker = db.latest_marker("cp", "events")
        assert marker is not None and marker.batch_id == 1 and marker.end_offsets == {0: 5}


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_long_table_names_with_one_prefix_keep_their_own_counts(
    backend: str, tmp_path: Path
) -> None:
    # 63 characters each, the same first 62: PostgreSQL keeps 63 bytes of an identifier, so
    # "_stage_" + name once named one staging table for both
    first, second = "t" * 62 + "a", "t" * 62 + "b"
    specs = [
        parse_table(name, {"plan": "properties.plan"}, {"n": "count(*)"})
        for name in (first, second)
    ]
    with database(backend, tmp_path) as url, open_db(url) as db:
        db.prepare(specs, "cp", fresh=True)
        for batch_id, rows in enumerate([{first: [("a", 1)], second: [("b", 10)]}] * 2):
            assert db.commit(Batch("q", batch_id, "cp", "events", None, rows, 11), specs)
        assert db.table_rows(specs[0]) == [("a", 2)]
        assert db.table_rows(specs[1]) == [("b", 20)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_definitions_and_second_jobs_are_refused(backend: str, tmp_path: Path) -> None:
    with database(backend, tmp_path) as url, open_db(url) as db:
        db.prepare([EVENT_COUNTS, PLANS], "cp", fresh=True)
        db.prepare([EVENT_COUNTS, PLANS], "cp", fresh=False)  # the same again: fine
        changed = parse_table("plan_hours", {"plan": "properties.plan"}, {"events": "count(*)"})
        with pytest.raises(ConfigError, match=r"another definition.*another table name"):
            db.prepare([EVENT_COUNTS, changed], "cp", fresh=False)
        with pytest.raises(ConfigError, match="filled by the job with checkpoint cp"):
            db.prepare([EVENT_COUNTS], "other", fresh=True)
        late = parse_table("late_table", {"plan": "properties.plan"}, {"events": "count(*)"})
        with pytest.raises(ConfigError, match="is new, but this job"):
            db.prepare([EVENT_COUNTS, PLANS, late], "cp", fresh=False)


@pytest.mark.spark
def test_unknown_columns_are_refused_at_start(spark: SparkSession) -> None:
    bad = parse_table("t", {"plan": "properties.plan"}, {"n": "sum(propertiez.seats)"})
    with pytest.raises(ConfigError, match=r"table 't', column 'n' = 'propertiez.seats'"):
        frame.check(spark, [EVENT_COUNTS, bad])
    nested = parse_table("t", {"plan": "count(event)"}, {"n": "count(*)"})
    with pytest.raises(ConfigError, match="aggregate table 't'"):
        frame.check(spark, [EVENT_COUNTS, nested])


@pytest.mark.spark
def test_only_the_event_fields_the_tables_read_are_parsed(spark: SparkSession) -> None:
    """Spark does not prune a ``from_json`` that several columns read, so the job cuts the schema
    itself; with partial results, a wrong-typed field it no longer parses changes nothing else."""
    from datetime import UTC, datetime

    from exactly.spark.datasource.source import SCHEMA as RECORD_SCHEMA

    pages = parse_table(
        "pages", {"day": "day", "url": "upper(context.page.url)"}, {"n": "count(userId)"}
    )
    counts, custom = frame.check(spark, [EVENT_COUNTS, pages])
    assert counts.fields == {"sourceId", "type", "event", "properties"}
    assert custom.fields == {"context", "userId"}
    assert frame.event_schema([counts]).fieldNames() == [
        "type",
        "event",
        "sourceId",
        "timestamp",
        "receivedAt",
        "properties",
    ]
    assert frame.event_schema([counts, pages]).fieldNames() == frame.event_schema().fieldNames()
    # the source reads the event counts' fields itself (the event's context it leaves to Spark)
    assert counts.lookups == {("properties", "revenue")}
    read = frame.source_fields([counts])
    assert read is not None and read.ddl == (
        "`type` string, `event` string, `sourceId` string, `timestamp` timestamp, "
        "`receivedAt` timestamp, `properties` map<string, string>"
    )
    assert read.fields[-1].keys == ("revenue",)
    assert frame.source_fields([counts, pages]) is None
    (plans,) = frame.check(spark, [PLANS])
    both = frame.source_fields([counts, plans])
    assert both is not None and both.fields[-1].keys == ("plan", "revenue", "seats")
    whole = parse_table("w", {"n": "cast(size(properties) AS STRING)"}, {"c": "count(*)"})
    by_column = parse_table("k", {"v": "properties[type]"}, {"c": "count(*)"})
    for spec in frame.check(spark, [whole, by_column]):
        assert spec.lookups is None
        assert frame.source_fields([counts, spec]) is None
    values = [
        b'{"type":"track","event":"A","sourceId":"s","timestamp":"2024-01-01T00:00:30Z",'
        b'"userId":{"not":"text"},"context":{"screen":{"width":"wide"}},"properties":{"revenue":2}}',
        b'{"type":"track","event":"A","sourceId":"s","receivedAt":"2024-01-01T00:00:40Z"}',
        b"not json",
    ]
    logged = datetime(2024, 1, 2, tzinfo=UTC)
    records = spark.createDataFrame(
        [(0, n, None, value, logged, []) for n, value in enumerate(values)], RECORD_SCHEMA
    )
    cut = frame.aggregate(frame.events_frame(records, [counts]), counts).collect()
    whole = frame.aggregate(frame.events_frame(records), counts).collect()
    assert sorted(map(tuple, cut)) == sorted(map(tuple, whole))
    assert sorted(tuple(row)[:5] for row in cut) == [
        ("", "", "", "2024-01-02 00:00:00", 1),
        ("s", "track", "A", "2024-01-01 00:00:00", 2),
    ]


@pytest.mark.spark
def test_sqlite_locked_for_a_while_the_job_waits_and_catches_up(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_url = f"sqlite://{tmp_path / 'log'}"
    url = f"sqlite://{tmp_path / 'aggregates.db'}"
    stream = EventStream(seed=5)
    said: list[str] = []
    with open_log(log_url) as log, open_db(url, say=said.append) as db:
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, distinct_raw(stream, 4000))
        locker = sqlite3.connect(
            tmp_path / "aggregates.db", isolation_level=None, check_same_thread=False
        )
        locked = threading.Event()

        def release() -> None:
            # held until the job has said it waits, and a second more (at most 120 s): a fixed
            # 12 s ran out under load before the next batch had even reached its commit
            deadline = time.monotonic() + 120
            while not any("unavailable" in line for line in said):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            time.sleep(1.0)
            locker.execute("COMMIT")

        def on_batch(batch_id: int, events: int, counted: bool) -> None:
            if not locked.is_set():  # another process takes the file between two batches
                locked.set()
                locker.execute("BEGIN EXCLUSIVE")
                threading.Thread(target=release, daemon=True).start()

        began = time.monotonic()
        progress = count(
            spark, log_url, db, tmp_path / "checkpoint", on_batch, max_records_per_trigger=1000
        )
        assert time.monotonic() - began > BUSY_SECONDS  # it waited out SQLite's own busy wait
        assert any("unavailable" in line for line in said), said
        assert progress.events == len(stream.events)
        assert_exact(db, list(stream.events.values()))


@pytest.mark.spark
def test_postgres_down_for_a_while_the_job_retries_and_catches_up(
    spark: SparkSession, tmp_path: Path
) -> None:
    require(postgres_missing())
    log_url = f"sqlite://{tmp_path / 'log'}"
    stream = EventStream(seed=6)
    proxy = Proxy()
    said: list[str] = []
    base = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
    with postgres_schema(base) as url, open_log(log_url) as log:
        db = open_db(url, say=said.append)
        log.create_topic("events", PARTITIONS)
        append(log, "events", PARTITIONS, distinct_raw(stream, 4000))
        outage = threading.Event()

        def on_batch(batch_id: int, events: int, counted: bool) -> None:
            if batch_id == 1 and not outage.is_set():  # down between two batches
                outage.set()
                proxy.down()
                threading.Timer(8.0, proxy.up).start()

        plan = job.AggregatePlan(
            log_url,
            tmp_path / "checkpoint",
            (EVENT_COUNTS, PLANS),
            until_caught_up=True,
            max_records_per_trigger=1000,
        )
        specs = frame.check(spark, plan.tables)
        start = job.prepare(log, db, plan, specs)
        began = time.monotonic()
        progress = job.run(spark, plan, db, specs, start, on_batch)
        assert time.monotonic() - began > 8
        assert outage.is_set() and any("unavailable" in line for line in said), said
        assert progress.events == len(stream.events)
        assert_exact(db, list(stream.events.values()))
        db.close()
