"""The dedupe task without Spark: claims, rejects, resume and repair, against a real log.

A micro-batch is simulated as Spark runs it: the source's Arrow batches of one raw partition go
through :func:`dedupe_partition`, and a stand-in for the exactly-once sink appends the rows it
yields, skipping as many as an earlier attempt already stored (what the real sink's marks do).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from exactly.dedupe.recovery import SOURCE_HEADER, source_offset
from exactly.dedupe.rocksdb import RocksDBStore
from exactly.dedupe.task import REJECTED_HEADER, TaskPlan, dedupe_partition
from exactly.dedupe.window import Bounds
from exactly.log import Log, Record, open_log
from exactly.spark.datasource.source import to_arrow


@pytest.fixture
def log(log_url: str) -> Iterator[Log]:
    """Both log backends (the ``log_url`` fixture of conftest)."""
    with open_log(log_url) as opened:
        yield opened


@pytest.fixture
def plan(log: Log, tmp_path: Path, topic: str) -> TaskPlan:
    """Fresh topics (the Kafka broker is shared by the session) and store."""
    raw, events, rejected = f"{topic}-raw", f"{topic}-events", f"{topic}-raw.rejected"
    for name in (raw, events, rejected):
        log.create_topic(name, 2)
    return TaskPlan(log.url, raw, events, rejected, RocksDBStore(tmp_path / "store"))


def event(message_id: str, n: int) -> Record:
    return Record(json.dumps({"messageId": message_id, "n": n}).encode(), key=message_id.encode())


def arrow_batches(
    log: Log, plan: TaskPlan, start: int, end: int, size: int = 3
) -> list[pa.RecordBatch]:
    records = [
        r for r in log.read(plan.source, 0, start, max_records=end - start) if r.offset < end
    ]
    return [to_arrow(records[at : at + size]) for at in range(0, len(records), size)]


def run_batch(
    log: Log,
    plan: TaskPlan,
    start: int,
    end: int,
    *,
    stored: int = 0,
    crash_after: int | None = None,
) -> int:
    """One attempt at micro-batch ``[start, end)``; returns how many rows the sink has of it."""
    rows: list[Record] = []
    for out in dedupe_partition(plan, iter(arrow_batches(log, plan, start, end))):
        for row in out.to_pylist():
            headers = tuple((h["key"], h["value"]) for h in row["headers"])
            rows.append(Record(row["value"], row["key"], headers))
    new = rows[stored:] if crash_after is None else rows[stored : stored + crash_after]
    if new:
        log.append(plan.output, 0, new)
    return stored + len(new)


def events(log: Log, plan: TaskPlan) -> list[tuple[bytes | None, bytes, int | None]]:
    return [
        (r.key, r.value, source_offset(r.headers))
        for r in log.read(plan.output, 0, 0, max_records=10_000)
    ]


def test_first_of_each_id_passes_within_and_across_batches(log: Log, plan: TaskPlan) -> None:
    ids = ["a", "b", "a", "c", "b", "d", "e", "a", "f"]
    log.append(plan.source, 0, [event(m, n) for n, m in enumerate(ids)])
    run_batch(log, plan, 0, 5)
    run_batch(log, plan, 5, 9)
    assert [(k, o) for k, _, o in events(log, plan)] == [
        (b"a", 0),
        (b"b", 1),
        (b"c", 3),
        (b"d", 5),
        (b"e", 6),
        (b"f", 8),
    ]
    # values untouched: the first received payload wins
    assert json.loads(events(log, plan)[0][1]) == {"messageId": "a", "n": 0}


def test_a_retried_task_after_partial_output_writes_each_record_once(
    log: Log, plan: TaskPlan
) -> None:
    ids = [f"m{n % 7}" for n in range(20)]
    log.append(plan.source, 0, [event(m, n) for n, m in enumerate(ids)])
    stored = run_batch(log, plan, 0, 20, crash_after=4)
    stored = run_batch(log, plan, 0, 20, stored=stored, crash_after=1)
    run_batch(log, plan, 0, 20, stored=stored)
    assert [o for _, _, o in events(log, plan)] == list(range(7))


def test_a_deleted_store_is_rebuilt_from_the_output(log: Log, plan: TaskPlan) -> None:
    log.append(plan.source, 0, [event(f"m{n}", n) for n in range(10)])
    run_batch(log, plan, 0, 10)
    assert isinstance(plan.store, RocksDBStore)
    plan.store.drop(0)
    log.append(plan.source, 0, [event(f"m{n}", 10 + n) for n in range(0, 20, 2)])
    run_batch(log, plan, 10, 20)
    assert [o for _, _, o in events(log, plan)] == [*range(10), 15, 16, 17, 18, 19]
    with plan.store.open(0) as part:
        assert part.position() == 20


def test_store_deleted_after_a_partial_output_still_resumes_exactly(
    log: Log, plan: TaskPlan
) -> None:
    ids = [f"m{n % 5}" for n in range(12)]
    log.append(plan.source, 0, [event(m, n) for n, m in enumerate(ids)])
    stored = run_batch(log, plan, 0, 12, crash_after=3)
    assert isinstance(plan.store, RocksDBStore)
    plan.store.drop(0)
    run_batch(log, plan, 0, 12, stored=stored)
    assert [o for _, _, o in events(log, plan)] == [0, 1, 2, 3, 4]


def test_rebuild_reaches_back_only_as_far_as_the_bounds(
    log: Log, plan: TaskPlan, tmp_path: Path
) -> None:
    plan = replace(plan, store=RocksDBStore(tmp_path / "s", Bounds(max_keys=5)))
    log.append(plan.source, 0, [event(f"m{n}", n) for n in range(10)])
    run_batch(log, plan, 0, 10)
    assert isinstance(plan.store, RocksDBStore)
    plan.store.drop(0)
    log.append(plan.source, 0, [event("m2", 10), event("m8", 11)])  # m2 is older than 5 ids back
    run_batch(log, plan, 10, 12)
    assert [o for _, _, o in events(log, plan)][-1:] == [10]
    with plan.store.open(0) as part:
        assert part.stats().keys <= 5  # 5 restored; the batch made room for 2 more


def test_bad_input_is_routed_to_rejected_once_and_keyless_events_are_keyed(
    log: Log, plan: TaskPlan
) -> None:
    log.append(
        plan.source,
        0,
        [
            Record(b"not json"),
            Record(b'{"messageId": "k1", "type": "track"}'),
            Record(b'["a list"]'),
            Record(b'{"type": "track"}', headers=(("h", b"1"),)),
            Record(b'{"messageId": 42}'),
            Record(b'{"messageId": "k1", "again": true}'),
        ],
    )
    run_batch(log, plan, 0, 6)
    run_batch(log, plan, 0, 6, stored=2)  # a replay: nothing twice, neither here nor there
    assert [(k, o) for k, _, o in events(log, plan)] == [(b"k1", 1), (b"42", 4)]
    rejected = log.read(plan.rejected, 0, 0)
    assert [r.value for r in rejected] == [b"not json", b'["a list"]', b'{"type": "track"}']
    reasons = [dict(r.headers)[REJECTED_HEADER] for r in rejected]
    assert reasons == [
        b"the value is not JSON",
        b"the value is not a JSON object",
        b"no messageId (no key, and no messageId string in the value)",
    ]
    assert [dict(r.headers)[SOURCE_HEADER] for r in rejected] == [b"0", b"2", b"3"]
    assert dict(rejected[2].headers)["h"] == b"1"


def test_without_a_store_only_routing_happens(log: Log, plan: TaskPlan) -> None:
    plan = replace(plan, store=None)  # the spark-state mode: Spark's operator decides
    log.append(plan.source, 0, [event("a", 0), event("a", 1), Record(b"?")])
    run_batch(log, plan, 0, 3)
    assert [o for _, _, o in events(log, plan)] == [0, 1]
    assert len(log.read(plan.rejected, 0, 0)) == 1


def test_a_batch_spanning_two_partitions_claims_each_in_its_own_store(
    log: Log, plan: TaskPlan
) -> None:
    """Spark hands the sink's worker Arrow batches of its own size: with several partitions read
    by one task (option readTasks), a batch can end one partition's run and begin the next's."""
    log.append(plan.source, 0, [event(f"a{n}", n) for n in range(3)])
    log.append(plan.source, 1, [event(f"b{n}", n) for n in range(3)] + [event("b0", 3)])
    both = log.read(plan.source, 0, 0) + log.read(plan.source, 1, 0)
    passed = [
        (row["partition"], row["key"])
        for out in dedupe_partition(plan, iter([to_arrow(both[:5]), to_arrow(both[5:])]))
        for row in out.to_pylist()
    ]
    assert passed == [(0, b"a0"), (0, b"a1"), (0, b"a2"), (1, b"b0"), (1, b"b1"), (1, b"b2")]
    for partition, position in ((0, 3), (1, 4)):  # each store holds its own partition's ids
        with plan.store.open(partition) as part:
            assert (part.stats().keys, part.position()) == (3, position)
    log.append(plan.source, 1, [event("b1", 4)])  # a later batch: b1 again
    later = to_arrow(log.read(plan.source, 1, 4))
    assert sum(out.num_rows for out in dedupe_partition(plan, iter([later]))) == 0
