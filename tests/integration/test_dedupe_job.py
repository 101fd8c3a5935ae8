"""The dedupe job on Spark, in process, for each store: exactness across batches, runs, replays,
failed tasks, a deleted store and age-out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql import SparkSession

from exactly.dedupe.job import STORES, DedupePlan, prepare, run, store_kind
from exactly.dedupe.rocksdb import RocksDBStore
from exactly.dedupe.status import collect, render
from exactly.dedupe.window import Bounds
from exactly.events import partition_for
from exactly.log import Log, Record, open_log
from tests.dedupe_stream import (
    EVENTS,
    RAW,
    Stream,
    actual_events,
    assert_deduplicated,
    read_all,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]
PARTITIONS = 2
HOUR = 3_600_000
KINDS = ("duplicate next", "duplicate chunk", "duplicate earlier", "rejected")


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    with open_log(f"sqlite://{tmp_path / 'log'}") as opened:
        opened.create_topic(RAW, PARTITIONS)
        yield opened


def plan_for(log: Log, tmp_path: Path, store: str, **changes: object) -> DedupePlan:
    settings: dict[str, object] = {
        "bounds": Bounds(window=HOUR),
        "until_caught_up": True,
        "max_records_per_trigger": 700,
        "read_records": 200,
    }
    settings.update(changes)
    return DedupePlan(
        log.url,
        store,
        tmp_path,
        tmp_path / f"checkpoint-{store_kind(store)}",
        **settings,  # type: ignore[arg-type]
    )


def forget_last_commit(checkpoint: Path) -> None:
    """Make Spark replay the last batch, as after a crash between the sink's commit and Spark's."""
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (checkpoint / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("store", STORES)
def test_exactly_the_first_of_each_message_id_across_batches_runs_and_replays(
    spark: SparkSession, log: Log, tmp_path: Path, store: str, dedupe_store: str
) -> None:
    stream = Stream(PARTITIONS, seed=2, duplicate_rate=0.006, reject_rate=0.002)  # Segment's 0.6%
    plan = plan_for(log, tmp_path, dedupe_store)
    partitions = prepare(log, plan)
    for _ in range(2):
        stream.append(log, 1_000)
        run(spark, plan, partitions)
    forget_last_commit(plan.checkpoint)
    run(spark, plan, partitions)  # the last batch again: nothing new in events
    assert min(stream.kinds.get(kind, 0) for kind in KINDS) >= 2
    assert_deduplicated(log, PARTITIONS)
    status = collect(log, plan)
    assert sum(p.committed or 0 for p in status.partitions) == stream.sent
    assert sum(p.passed for p in status.partitions) == len(stream.seen)
    assert sum(p.rejected for p in status.partitions) == stream.kinds["rejected"]
    assert "partition" in render(status)


def fail_first_attempt(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Pass rows on, then fail a task's first attempt after its second batch (after its only
    one: spark-state's tasks hand on one sorted batch)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    first = context is not None and context.attemptNumber() == 0
    passed = 0
    for batch in batches:
        yield batch
        passed += 1
        if first and passed >= 2:
            raise RuntimeError("injected failure after the claims and some output")
    if first and passed:
        raise RuntimeError("injected failure after the claims and some output")


@pytest.mark.parametrize("store", STORES)
def test_a_task_failing_after_its_claims_is_retried_exactly(
    spark: SparkSession, log: Log, tmp_path: Path, store: str, dedupe_store: str
) -> None:
    stream = Stream(PARTITIONS, seed=11, duplicate_rate=0.05)
    stream.append(log, 1_000)
    plan = plan_for(log, tmp_path, dedupe_store, max_records_per_trigger=2_000, read_records=100)
    partitions = prepare(log, plan)

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    spark_log = Path(spark.conf.get("spark.exactly.log") or "")
    logged = spark_log.stat().st_size if spark_log.exists() else 0
    try:
        run(spark, plan, partitions, then=fail_first_attempt)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert_deduplicated(log, PARTITIONS)
    with spark_log.open(errors="replace") as text:  # the failures fired: Spark logged each
        text.seek(logged)
        failed = text.read().count("RuntimeError: injected failure after the claims")
    assert failed >= 2, f"the injected failure fired {failed} times"


def test_a_deleted_rocksdb_partition_is_rebuilt_from_events(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    stream = Stream(PARTITIONS, seed=3)
    stream.append(log, 800)
    plan = plan_for(log, tmp_path, "rocksdb")
    partitions = prepare(log, plan)
    run(spark, plan, partitions)
    store = plan.open_store()
    assert isinstance(store, RocksDBStore)
    kept = store.stats(PARTITIONS)[0].keys
    store.drop(0)
    # every id of partition 0 again, with new payloads: all within the window, all duplicates
    again = [
        Record(json.dumps({"messageId": k.decode(), "again": True}).encode(), key=k)
        for k, _, _ in actual_events(log, 0)
    ]
    log.append(RAW, 0, again)
    run(spark, plan, partitions)
    assert_deduplicated(log, PARTITIONS)
    assert store.stats(PARTITIONS)[0].keys == kept


def test_age_out_keeps_the_store_small_and_older_duplicates_pass(
    spark: SparkSession, log: Log, tmp_path: Path
) -> None:
    ids = [f"id-{n}" for n in range(1_200)]
    by_partition: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for message_id in ids:
        by_partition[partition_for(message_id, PARTITIONS)].append(message_id)
    for partition, found in by_partition.items():
        log.append(RAW, partition, [Record(b"{}", key=m.encode()) for m in found])
    plan = plan_for(log, tmp_path, "rocksdb", bounds=Bounds(max_keys=100, window=HOUR))
    partitions = prepare(log, plan)
    run(spark, plan, partitions)
    old = {p: found[:5] for p, found in by_partition.items()}
    recent = {p: found[-5:] for p, found in by_partition.items()}
    for partition in range(PARTITIONS):
        log.append(
            RAW,
            partition,
            [Record(b"again", key=m.encode()) for m in old[partition] + recent[partition]],
        )
    run(spark, plan, partitions)
    status = collect(log, plan)
    for part in status.partitions:
        assert part.keys is not None and part.keys <= 100
        assert part.window is not None  # ids were aged out: the window is bounded now
        events = [r.key for r in read_all(log, EVENTS, part.partition)]
        assert events[-5:] == [m.encode() for m in old[part.partition]]  # passed again
        assert len(events) == len(by_partition[part.partition]) + 5


@pytest.mark.parametrize("store", ["rocksdb", "spark-state"])
def test_tasks_reading_several_partitions_stay_exact_in_small_arrow_batches(
    spark: SparkSession, tmp_path: Path, store: str
) -> None:
    """More raw partitions than cores: a task reads several (one read task per core), and Spark
    hands the sink's worker Arrow batches of its own size, which can span two partitions."""
    partitions = 8
    with open_log(f"sqlite://{tmp_path / 'log8'}") as log:
        log.create_topic(RAW, partitions)
        stream = Stream(partitions, seed=5, duplicate_rate=0.03, reject_rate=0.01)
        plan = plan_for(log, tmp_path, store, max_records_per_trigger=2_000)
        prepared = prepare(log, plan)
        size = "spark.sql.execution.arrow.maxRecordsPerBatch"
        before = spark.conf.get(size)
        spark.conf.set(size, "64")
        try:
            for _ in range(2):
                stream.append(log, 1_500)
                run(spark, plan, prepared)
        finally:
            spark.conf.set(size, before)
        assert stream.kinds.get("duplicate earlier", 0) >= 5
        assert_deduplicated(log, partitions)


def from_sources(log: Log) -> list[tuple[int, str, str]]:
    """The same messageIds from two sources (and from a tool writing no sourceId), each retried
    once by its own source; appended to raw. Returns (partition, source, messageId) per record.

    ``web`` writes the collector's layout (compact, sourceId last), ``ios`` puts sourceId first
    with spaces (the task parses those), the tool none at all (source "").
    """
    sent: list[tuple[int, str, str]] = []
    for round_ in range(2):  # the second round: every record retried by its own source
        for n in range(12):
            message_id = f"shared-{n}"
            partition = partition_for(message_id, PARTITIONS)
            records = []
            for source in ("web", "ios", ""):
                body: dict[str, object] = {"messageId": message_id, "n": n, "round": round_}
                if source == "web":
                    value = orjson.dumps({**body, "sourceId": "web"})
                elif source == "ios":
                    value = json.dumps({"sourceId": "ios", **body}).encode()
                else:
                    value = orjson.dumps(body)
                records.append(Record(value, key=message_id.encode()))
                sent.append((partition, source, message_id))
            log.append(RAW, partition, records)
    return sent


@pytest.mark.parametrize("scope", ["source", "workspace"])
@pytest.mark.parametrize("store", STORES)
def test_the_same_message_id_from_two_sources_lands_twice_unless_deduped_workspace_wide(
    spark: SparkSession,
    log: Log,
    tmp_path: Path,
    store: str,
    dedupe_store: str,
    scope: str,
) -> None:
    sent = from_sources(log)
    changes = {} if scope == "source" else {"scope": scope}  # source is the default
    plan = plan_for(log, tmp_path, dedupe_store, **changes)
    run(spark, plan, prepare(log, plan))
    for partition in range(PARTITIONS):
        got = [orjson.loads(value) for _, value, _ in actual_events(log, partition)]
        landed = [(event.get("sourceId", ""), event["messageId"]) for event in got]
        mine = [(source, m) for p, source, m in sent if p == partition]
        if scope == "source":
            want = list(dict.fromkeys(mine))  # the first of each (source, messageId)
        else:
            firsts = dict.fromkeys(m for _, m in mine)
            want = [(next(s for s, m2 in mine if m2 == m), m) for m in firsts]
        assert landed == want
        assert all(event["round"] == 0 for event in got)  # retries are dropped
