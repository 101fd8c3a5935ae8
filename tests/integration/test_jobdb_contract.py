"""The JobDB contract, the same assertions on every backend (sqlite, postgresql, mysql)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exactly.delivery import packs
from exactly.delivery.jobdb import BACKENDS, JobDB, open_jobdb
from exactly.delivery.jobdb.base import (
    ARCHIVED,
    AWAITING_RETRY,
    AWAITING_SCHEDULING,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    SUCCEEDED,
    Batch,
    BatchStep,
    Members,
    NewJob,
    Transition,
)
from exactly.delivery.jobdb.runs import JobRun, RoutedJobs
from exactly.delivery.jobdb.sql.rows import STATEMENT_BYTES
from exactly.errors import DirectorLockHeld
from tests.jobdb import jobdb_url


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with jobdb_url(request.param, tmp_path) as found:
        yield found


@pytest.fixture
def db(url: str) -> Iterator[JobDB]:
    with open_jobdb(url, dataset_rows=10) as opened:
        yield opened


def jobs(
    count: int, *, source: str = "web", destination: str = "hook", start: int = 0
) -> list[NewJob]:
    return [
        NewJob(
            source=source,
            destination=destination,
            payload=b'{"messageId":"m%d","event":"x\\u00e9"}' % i,
            message_id=f"m{i}",
            user_id=f"u{i % 3}",
        )
        for i in range(start, start + count)
    ]


def test_added_jobs_are_pending_in_order(db: JobDB) -> None:
    assert db.add(jobs(5), query_id="q", batch_id=0) == 5
    found = db.pending("web/hook")
    assert [job.message_id for job in found] == [f"m{i}" for i in range(5)]
    first = found[0]
    assert first.state == AWAITING_SCHEDULING and first.attempt == 0
    assert first.payload == b'{"messageId":"m0","event":"x\\u00e9"}'
    assert first.destination == "hook" and first.user_id == "u0"
    assert first.expire_at > first.created_at
    assert db.buckets() == ["web/hook"]
    assert db.pending("web/other") == []
    assert [job.message_id for job in db.pending("web/hook", after=found[2].id)] == ["m3", "m4"]
    assert len(db.pending("web/hook", limit=2)) == 2


def test_a_replayed_micro_batch_adds_nothing(db: JobDB, url: str) -> None:
    assert db.add(jobs(3), query_id="q", batch_id=7) == 3
    assert db.add(jobs(3), query_id="q", batch_id=7) == 0
    assert db.add(jobs(3), query_id="q", batch_id=6) == 0
    assert db.add(jobs(1, start=3), query_id="q", batch_id=8) == 1
    assert db.add(jobs(2, start=4), query_id="other", batch_id=0) == 2
    with open_jobdb(url) as again:  # the marker is durable
        assert again.marker("q") == 8
        assert again.add(jobs(3), query_id="q", batch_id=8) == 0
        assert len(again.pending("web/hook")) == 6


def test_the_marker_keeps_where_each_stream_stopped(db: JobDB, url: str) -> None:
    assert db.end_offsets("events@/cp") is None
    db.add(jobs(2), query_id="q1", batch_id=0, stream="events@/cp", end_offsets={1: 9, 0: 4})
    db.add(jobs(1, start=2), query_id="q1", batch_id=1, stream="events@/cp", end_offsets={0: 6})
    db.add(jobs(1, start=3), query_id="q1", batch_id=1, stream="events@/cp", end_offsets={0: 99})
    db.add(jobs(1, start=4), query_id="q9", batch_id=0, stream="other", end_offsets={0: 1})
    assert db.end_offsets("events@/cp") == {0: 6}  # the replay moved nothing
    time.sleep(0.01)
    # a lost checkpoint: a new query id over the same stream; the newest marker wins
    db.add([], query_id="q2", batch_id=0, stream="events@/cp", end_offsets={0: 7, 1: 9})
    with open_jobdb(url) as again:
        assert again.end_offsets("events@/cp") == {0: 7, 1: 9}
        assert again.end_offsets("other") == {0: 1}
        assert again.marker("q2") == 0 and again.marker("q1") == 1
    assert len(db.pending("web/hook")) == 4  # the replayed batch added none


def test_route_spans_open_where_the_stream_stopped_and_close_when_a_destination_goes(
    db: JobDB,
) -> None:
    def spans(name: str) -> list[tuple[dict[int, int], dict[int, int] | None]]:
        found = db.spans(name, "events")
        return [(dict(span.start), None if span.end is None else dict(span.end)) for span in found]

    stream = "events@/checkpoint"
    db.open_routes(stream, "events", ["a"])  # nothing routed yet: from the log's start
    assert spans("a") == [({}, None)]
    db.add([], query_id="q", batch_id=0, stream=stream, end_offsets={0: 5, 1: 2})
    db.open_routes(stream, "events", ["a", "b"])  # b joins where the stream got to
    db.open_routes(stream, "events", ["a", "b"])  # a restart changes nothing
    assert spans("a") == [({}, None)] and spans("b") == [({0: 5, 1: 2}, None)]
    db.add([], query_id="q", batch_id=1, stream=stream, end_offsets={0: 9, 1: 2})
    db.open_routes(stream, "events", ["b"])  # a goes: its span closes there
    assert spans("a") == [({}, {0: 9, 1: 2})]
    db.add([], query_id="q", batch_id=2, stream=stream, end_offsets={0: 12, 1: 4})
    db.open_routes(stream, "events", ["a", "b"])  # and comes back: a gap between
    assert sorted(spans("a"), key=str) == sorted(
        [({}, {0: 9, 1: 2}), ({0: 12, 1: 4}, None)], key=str
    )
    assert db.spans("a", "other") == []
    # a stream routed before spans were kept: its destinations count as routed from the start
    db.add([], query_id="old", batch_id=7, stream="events@/old", end_offsets={0: 3})
    db.open_routes("events@/old", "events", ["c"])
    assert spans("c") == [({}, None)]


def test_a_jobdb_from_before_stream_markers_gains_their_columns(url: str) -> None:
    with open_jobdb(url) as db:
        db.add(jobs(1), query_id="q", batch_id=0)
        connection = db._connection  # type: ignore[attr-defined]
        cursor = connection.cursor()
        for column in ("stream", "end_offsets", "committed_at"):
            cursor.execute(f"ALTER TABLE jobdb_markers DROP COLUMN {column}")
        connection.commit()
    with open_jobdb(url) as db:
        assert db.marker("q") == 0 and db.end_offsets("s") is None
        db.add(jobs(1, start=1), query_id="q", batch_id=1, stream="s", end_offsets={0: 3})
        assert db.end_offsets("s") == {0: 3}


# dataset tables as a JobDB made them when each job kept its endpoint and headers
LEGACY_JOBS = (
    "CREATE TABLE jobs_{n} (id {id} PRIMARY KEY, bucket {text} NOT NULL, destination {text} "
    "NOT NULL, endpoint {body} NOT NULL, headers {body} NOT NULL, payload {blob} NOT NULL, "
    "message_id {text} NOT NULL, user_id {text}, created_at {real} NOT NULL, "
    "expire_at {real} NOT NULL)"
)


def test_a_dataset_made_when_jobs_kept_credentials_takes_no_new_jobs(url: str) -> None:
    """Its NOT NULL endpoint and headers would refuse today's jobs: they go to a new dataset,
    while its own jobs are still pending, traced and archived (without those columns)."""
    from exactly.delivery.jobdb.sql import SQLJobDB

    now = time.time()
    with open_jobdb(url) as db:
        assert isinstance(db, SQLJobDB)
        with db._mutex:
            cursor = db._cursor()  # dataset 1 made as today, then replaced by an old one
            db._execute(cursor, "DROP TABLE jobs_1")
            db._connection.commit()
            db._execute(cursor, LEGACY_JOBS.format(n=1, **db.types))
            db._connection.commit()
            db._execute(
                cursor,
                "INSERT INTO jobs_1 (id, bucket, destination, endpoint, headers, payload, "
                "message_id, user_id, created_at, expire_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (1, "web/hook", "hook", "http://u:pw@h/", "{}", b"{}", "old", None, now, now + 60),
            )
            db._execute(cursor, "UPDATE jobdb_datasets SET n_rows = 1 WHERE number = 1")
            db._connection.commit()
    with open_jobdb(url) as db:
        assert db.add(jobs(2), query_id="q", batch_id=0) == 2
        assert db.add(jobs(1, start=2), query_id="q", batch_id=1) == 1
        assert [(d.number, d.rows) for d in db.datasets()] == [(1, 1), (2, 3)]
        old, *new = db.pending("web/hook")
        assert (old.id, old.message_id, old.payload) == (1, "old", b"{}")
        assert [job.message_id for job in new] == ["m0", "m1", "m2"]
        assert [job.message_id for job, _ in db.jobs_with("old")] == ["old"]
        db.record([Transition(old.id, EXECUTING, 1), Transition(old.id, SUCCEEDED, 1)])
        assert db.archivable() == [1]
        archived: list[dict[str, Any]] = []
        db.archive(1, archived.extend)
        assert [record["message_id"] for record in archived] == ["old"]
        assert not {"endpoint", "headers"} & set(archived[0])
        assert [d.number for d in db.datasets()] == [2]


def test_a_dataset_is_indexed_by_message_id_as_it_closes(db: JobDB) -> None:
    """The newest dataset has no message id index (kept up row by row, it was a quarter of the
    router's insert); the router builds it before it opens the next. Trace finds a message's
    jobs in both."""
    from exactly.delivery.jobdb.sql import SQLJobDB

    assert isinstance(db, SQLJobDB)
    db.add(jobs(8), query_id="q", batch_id=0)
    assert _indexes(db, "jobs_1") == {"jobs_1_bucket"}
    db.add(jobs(6, start=8), query_id="q", batch_id=1)  # dataset_rows=10: 8 in 1, 6 in 2
    assert _indexes(db, "jobs_1") == {"jobs_1_bucket", "jobs_1_message"}
    assert _indexes(db, "jobs_2") == {"jobs_2_bucket"}
    for message_id, dataset in (("m3", 1), ("m11", 2)):
        ((job, _),) = db.jobs_with(message_id)
        assert db.datasets()[dataset - 1].holds(job.id)


def _indexes(db: Any, table: str) -> set[str]:
    """The names of ``table``'s indexes other than its primary key, in each backend's catalog."""
    query = {
        "sqlite": "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? "
        "AND name NOT LIKE 'sqlite_autoindex%'",
        "postgresql": "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
        "AND tablename = ? AND indexname <> CONCAT(tablename, '_pkey')",
        "mysql": "SELECT DISTINCT index_name FROM information_schema.statistics "
        "WHERE table_schema = DATABASE() AND table_name = ? AND index_name <> 'PRIMARY'",
    }[db.scheme]
    with db._mutex:
        cursor = db._execute(db._cursor(), query, (table,))
        found = {str(row[0]) for row in cursor.fetchall()}
        db._connection.commit()
    return found


def test_transitions_set_the_state(db: JobDB) -> None:
    db.add(jobs(4), query_id="q", batch_id=0)
    a, b, c, d = db.pending("web/hook")
    db.record([Transition(job.id, EXECUTING, 1) for job in (a, b, c, d)])
    assert {job.state for job in db.pending("web/hook")} == {EXECUTING}
    db.record(
        [
            Transition(a.id, SUCCEEDED, 1, status_code=200),
            Transition(b.id, DISCARDED, 1, status_code=400, response="bad" * 1000),
            Transition(c.id, AWAITING_RETRY, 1, retry_at=time.time() + 5, status_code=503),
            Transition(d.id, EXPIRED, 1, error_type="expired"),
        ]
    )
    (left,) = db.pending("web/hook")
    assert (left.id, left.state, left.attempt) == (c.id, AWAITING_RETRY, 1)
    assert left.retry_at is not None and left.retry_at > time.time()
    history = db.history(b.id)
    assert [step.state for step in history] == [EXECUTING, DISCARDED]
    assert history[1].status_code == 400
    assert history[1].response is not None and len(history[1].response) == 1024
    assert db.states() == {"hook": {SUCCEEDED: 1, DISCARDED: 1, AWAITING_RETRY: 1, EXPIRED: 1}}
    with pytest.raises(ValueError, match="unknown job state"):
        db.record([Transition(a.id, "lost", 1)])


def test_a_batch_is_recorded_once_and_its_outcome_applies_to_each_member(
    db: JobDB, url: str
) -> None:
    """A batch (its members spanning two datasets) recorded with its members' ``executing``;
    its retries are steps of the batch alone; its end gives each member its outcome."""
    db.add(jobs(8), query_id="q", batch_id=0)
    db.add(jobs(6, start=8), query_id="q", batch_id=1)  # dataset_rows=10: 8 in 1, 6 in 2
    pending = db.pending("web/hook")
    first = Batch("batch_a", "web/hook", "hook", tuple(job.id for job in pending[5:10]))
    second = Batch("batch_b", "web/hook", "hook", tuple(job.id for job in pending[10:12]))
    assert {db.datasets()[0].holds(i) for i in first.job_ids} == {True, False}
    executing = [Transition(i, EXECUTING, 1) for i in (*first.job_ids, *second.job_ids)]
    db.record(
        executing,
        batches=[first, second],
        steps=[BatchStep("batch_a", EXECUTING, 1), BatchStep("batch_b", EXECUTING, 1)],
    )
    retry_at = time.time() + 30
    db.record(
        [], steps=[BatchStep("batch_a", AWAITING_RETRY, 1, retry_at=retry_at, status_code=503)]
    )
    db.record([], steps=[BatchStep("batch_a", EXECUTING, 2)])  # a retry, then a crash
    # which batch a job went in (exactly trace): by destination and id range, then membership
    assert [db.batch_of("hook", i) for i in (*first.job_ids, *second.job_ids)] == [
        "batch_a"
    ] * 5 + ["batch_b"] * 2
    assert (
        db.batch_of("hook", pending[0].id) is None
        and db.batch_of("other", first.job_ids[0]) is None
    )
    with open_jobdb(url) as again:  # what a director finds on its start
        found = again.open_batches("web/hook")
        assert [b.batch for b in found] == [
            Batch("batch_a", "web/hook", "hook", first.job_ids, found[0].batch.created_at),
            Batch("batch_b", "web/hook", "hook", second.job_ids, found[1].batch.created_at),
        ]
        assert [job.id for job in found[0].jobs] == list(first.job_ids)
        assert [job.payload for job in found[0].jobs] == [job.payload for job in pending[5:10]]
        assert {job.state for job in found[0].jobs} == {EXECUTING}
        assert (found[0].state, found[0].attempt) == (EXECUTING, 2)
        assert again.open_batches("web/other") == []
    db.record(
        [Transition(i, SUCCEEDED, 2, status_code=200) for i in first.job_ids],
        steps=[BatchStep("batch_a", SUCCEEDED, 2, status_code=200)],
    )
    db.record([], steps=[BatchStep("batch_b", AWAITING_RETRY, 1, retry_at=retry_at)])
    (left,) = db.open_batches("web/hook")
    assert (left.batch.id, left.state, left.retry_at) == ("batch_b", AWAITING_RETRY, retry_at)
    # a member has two transitions, whatever the batch's attempts
    assert [step.state for step in db.history(first.job_ids[0])] == [EXECUTING, SUCCEEDED]
    batch, steps = db.batch_history("batch_a") or (None, [])
    assert batch is not None and batch.job_ids == first.job_ids
    assert [(s.state, s.attempt, s.status_code) for s in steps] == [
        (EXECUTING, 1, None),
        (AWAITING_RETRY, 1, 503),
        (EXECUTING, 2, None),
        (SUCCEEDED, 2, 200),
    ]
    assert db.states() == {"hook": {AWAITING_SCHEDULING: 7, SUCCEEDED: 5, EXECUTING: 2}}
    assert db.batch_history("nothing") is None


def test_batches_go_with_the_last_dataset_of_their_members(db: JobDB) -> None:
    db.add(jobs(8), query_id="q", batch_id=0)
    db.add(jobs(6, start=8), query_id="q", batch_id=1)
    db.add(jobs(9, start=14), query_id="q", batch_id=2)  # datasets 1, 2, 3
    pending = db.pending("web/hook")
    groups = {"in_1": pending[0:8], "across": pending[7:10], "in_2": pending[10:13]}
    for name, members in groups.items():
        if name == "across":
            members = members[1:]  # job 8 is in batch in_1 already
        ids = tuple(job.id for job in members)
        db.record(
            [Transition(i, SUCCEEDED, 1) for i in ids],
            batches=[Batch(name, "web/hook", "hook", ids)],
            steps=[BatchStep(name, SUCCEEDED, 1)],
        )
    db.record([Transition(job.id, SUCCEEDED, 1) for job in pending[13:14]])
    assert db.archivable() == [1, 2]
    db.archive(1, lambda records: None)
    assert db.batch_history("in_1") is None  # all its members dropped
    assert db.batch_history("across") is not None  # one member still live
    db.archive(2, lambda records: None)
    assert db.batch_history("across") is None and db.batch_history("in_2") is None


def test_members_write_a_transition_per_job_across_datasets(db: JobDB) -> None:
    db.add(jobs(8), query_id="q", batch_id=0)
    db.add(jobs(6, start=8), query_id="q", batch_id=1)  # datasets 1 and 2
    pending = db.pending("web/hook")
    across = tuple(job.id for job in pending[5:11])
    alone = tuple(job.id for job in pending[11:14])
    db.record(
        [Transition(pending[0].id, EXECUTING, 1)],
        batches=[Batch("across", "web/hook", "hook", across)],
        steps=[BatchStep("across", EXECUTING, 1)],
        members=[Members(across, EXECUTING, 1), Members(alone, EXECUTING, 3)],
    )
    db.record(
        [],
        steps=[BatchStep("across", DISCARDED, 1)],
        members=[
            Members(across, DISCARDED, 1, status_code=400, response="no" * 1000),
            Members((), SUCCEEDED, 1),
        ],
    )
    for job_id in across:
        assert [(t.state, t.attempt, t.status_code) for t in db.history(job_id)] == [
            (EXECUTING, 1, None),
            (DISCARDED, 1, 400),
        ]
        assert len(db.history(job_id)[-1].response or "") == 1024
    assert [(t.state, t.attempt) for t in db.history(alone[0])] == [(EXECUTING, 3)]
    assert db.states() == {"hook": {AWAITING_SCHEDULING: 4, EXECUTING: 4, DISCARDED: 6}}
    with pytest.raises(ValueError, match="unknown job state"):
        db.record([], members=[Members(alone, "lost", 1)])
    assert [(t.state, t.attempt) for t in db.history(alone[0])] == [(EXECUTING, 3)]


def test_a_batch_id_is_recorded_once(db: JobDB) -> None:
    db.add(jobs(2), query_id="q", batch_id=0)
    ids = tuple(job.id for job in db.pending("web/hook"))
    batch = Batch("batch_x", "web/hook", "hook", ids)
    db.record([], batches=[batch], steps=[BatchStep("batch_x", EXECUTING, 1)])
    with pytest.raises(Exception):  # noqa: B017 (each driver's IntegrityError)
        db.record(
            [Transition(i, EXECUTING, 1) for i in ids],
            batches=[batch],
            steps=[BatchStep("batch_x", EXECUTING, 1)],
        )
    assert {job.state for job in db.pending("web/hook")} == {AWAITING_SCHEDULING}  # rolled back
    (found,) = db.open_batches("web/hook")
    assert found.attempt == 1


def test_buckets_are_separate(db: JobDB) -> None:
    db.add(jobs(2) + jobs(3, destination="other", start=2), query_id="q", batch_id=0)
    db.add(jobs(1, source="ios", start=5), query_id="q", batch_id=1)
    assert db.buckets() == ["ios/hook", "web/hook", "web/other"]
    assert len(db.pending("web/other")) == 3
    assert [job.destination for job in db.pending("ios/hook")] == ["hook"]


def test_datasets_roll_and_archived_ones_are_dropped(db: JobDB) -> None:
    for batch in range(3):  # 25 jobs, 10 per dataset
        db.add(jobs(8 if batch < 2 else 9, start=batch * 10), query_id="q", batch_id=batch)
    numbers = [dataset.number for dataset in db.datasets()]
    assert numbers == [1, 2, 3]
    assert db.archivable() == []  # all pending
    everything = db.pending("web/hook")
    assert len(everything) == 25
    first = [job for job in everything if db.datasets()[0].holds(job.id)]
    db.record([Transition(job.id, SUCCEEDED, 1) for job in first])
    assert db.archivable() == [1]
    archived: list[dict[str, Any]] = []
    db.archive(1, archived.extend)
    assert [record["message_id"] for record in archived] == [job.message_id for job in first]
    assert [step["state"] for step in archived[0]["transitions"]] == [SUCCEEDED, "archiving"]
    assert [dataset.number for dataset in db.datasets()] == [2, 3]
    assert len(db.pending("web/hook")) == 25 - len(first)
    # the newest dataset is never archived, even when all its jobs are done
    db.record([Transition(job.id, DISCARDED, 1) for job in db.pending("web/hook")])
    assert db.archivable() == [2]
    db.archive(2, lambda records: None)
    assert [dataset.number for dataset in db.datasets()] == [3]
    assert ARCHIVED  # archived transitions go with the dropped tables


def test_a_reader_beside_the_director_reads_again_when_a_dataset_is_dropped_under_it(
    db: JobDB, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `exactly deliveries`, up's view and the console read while the director archives: a
    # reader that listed the datasets just before a drop must not fail on the missing table
    for batch in range(3):  # 25 jobs, 10 per dataset
        db.add(jobs(8 if batch < 2 else 9, start=batch * 10), query_id="q", batch_id=batch)
    with open_jobdb(url) as reader:
        stale = reader.datasets()
        first = [job for job in db.pending("web/hook") if stale[0].holds(job.id)]
        db.record([Transition(job.id, SUCCEEDED, 1) for job in first])
        db.archive(1, lambda records: None)
        load = reader._load_datasets  # type: ignore[attr-defined]
        listings: list[int] = []

        def listed_before_the_drop(cursor: Any) -> Any:
            listings.append(1)
            if len(listings) == 1:
                reader._datasets = list(stale)  # type: ignore[attr-defined]
                return reader._datasets  # type: ignore[attr-defined]
            return load(cursor)

        monkeypatch.setattr(reader, "_load_datasets", listed_before_the_drop)
        pending = 25 - len(first)
        assert sum(reader.states()["hook"].values()) == pending
        assert len(listings) >= 2  # the stale listing failed, and was read again
        listings.clear()
        assert sum(reader.summary()["hook"].states.values()) == pending


def test_unpaged_counts_a_buckets_jobs_above_a_cursor_across_datasets(db: JobDB) -> None:
    for batch in range(3):  # 25 jobs of web/hook in three datasets, 3 of web/other
        db.add(jobs(8 if batch < 2 else 9, start=batch * 10), query_id="q", batch_id=batch)
    db.add(jobs(3, destination="other", start=40), query_id="q", batch_id=3)
    ids = [job.id for job in db.pending("web/hook")]
    assert len(db.datasets()) >= 3
    assert db.unpaged("web/hook", after=0) == 25
    assert db.unpaged("web/hook", after=ids[11]) == 13
    assert db.unpaged("web/hook", after=ids[-1]) == 0
    assert db.unpaged("web/other", after=0) == 3


def test_new_datasets_keep_ids_growing(db: JobDB) -> None:
    ids: list[int] = []
    for batch in range(4):
        db.add(jobs(6, start=batch * 6), query_id="q", batch_id=batch)
    ids = [job.id for job in db.pending("web/hook")]
    assert ids == sorted(ids) and len(set(ids)) == 24


def _hold(url: str, ready: Any) -> None:
    with open_jobdb(url).director_lock():
        ready.set()
        time.sleep(600)


def test_one_director_holds_the_lock_and_a_standby_takes_over(url: str) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold, args=(url, ready))
    holder.start()
    try:
        assert ready.wait(60)
        db = open_jobdb(url)
        with pytest.raises(DirectorLockHeld), db.director_lock(wait=False):
            pass
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(30)
        started = time.monotonic()
        with db.director_lock():
            assert time.monotonic() - started < 10
        db.close()
    finally:
        if holder.is_alive():
            holder.kill()


def test_summary_per_destination(db: JobDB) -> None:
    db.add(jobs(3) + jobs(2, destination="other", start=3), query_id="q", batch_id=0)
    a, b, _ = db.pending("web/hook")
    db.record([Transition(job.id, EXECUTING, 1) for job in (a, b)])
    db.record(
        [
            Transition(a.id, SUCCEEDED, 1, status_code=200),
            Transition(
                b.id,
                AWAITING_RETRY,
                1,
                retry_at=time.time() + 9,
                status_code=503,
                response="busy\n  now",
            ),
        ]
    )
    found = db.summary(time.time() + 30)
    hook, other = found["hook"], found["other"]
    assert hook.states == {SUCCEEDED: 1, AWAITING_RETRY: 1, AWAITING_SCHEDULING: 1}
    assert hook.queued == 1 and other.queued == 2
    assert hook.last_error == "503: busy now" and hook.last_error_at is not None
    assert other.last_error is None
    assert hook.oldest_pending_seconds is not None and hook.oldest_pending_seconds >= 30
    assert hook.succeeded_last_minute == 1 and other.succeeded_last_minute == 0
    assert db.summary(time.time() + 120)["hook"].succeeded_last_minute == 0  # a minute later


def test_a_kept_summary_reads_again_only_the_datasets_that_changed(db: JobDB, url: str) -> None:
    """The view and the console keep one JobDB open and call ``summary`` each second: each
    call must equal a fresh JobDB's, and scan only the datasets that got jobs or transitions."""
    scanned: list[int] = []

    def fresh(now: float) -> dict[str, Any]:
        with open_jobdb(url) as other:
            return {name: vars_of(found) for name, found in other.summary(now).items()}

    def vars_of(summary: Any) -> tuple[Any, ...]:
        return (
            summary.states,
            summary.last_error,
            summary.succeeded_last_minute,
            summary.oldest_pending_seconds is None,
        )

    with open_jobdb(url) as reader:
        read_part = reader._part  # type: ignore[attr-defined]

        def counting(cursor: Any, n: int, version: tuple[int, int, int]) -> Any:
            scanned.append(n)
            return read_part(cursor, n, version)

        reader._part = counting  # type: ignore[attr-defined]

        def summary() -> dict[str, Any]:
            scanned.clear()
            now = time.time()
            found = {name: vars_of(entry) for name, entry in reader.summary(now).items()}
            assert found == fresh(now)
            return found

        for batch in range(3):  # datasets 1 to 3, full
            db.add(jobs(10, start=10 * batch), query_id="q", batch_id=batch)
        db.add(jobs(4, destination="other", start=30), query_id="q", batch_id=3)  # dataset 4
        summary()
        assert sorted(scanned) == [1, 2, 3, 4]
        summary()
        assert scanned == []  # nothing changed: nothing scanned
        first = db.pending("web/hook", limit=2)
        db.record([Transition(job.id, EXECUTING, 1) for job in first])
        db.record([Transition(first[0].id, SUCCEEDED, 1, status_code=200)])
        db.record([Transition(first[1].id, DISCARDED, 1, status_code=400, response="no")])
        found = summary()
        assert scanned == [1]
        assert found["hook"][0] == {SUCCEEDED: 1, DISCARDED: 1, AWAITING_SCHEDULING: 28}
        assert found["hook"][1] == "400: no" and found["hook"][2] == 1
        db.add(jobs(3, destination="other", start=40), query_id="q", batch_id=4)
        found = summary()
        assert scanned == [4] and found["other"][0] == {AWAITING_SCHEDULING: 7}
        assert summary() and scanned == []


def test_recent_successes_are_the_newest_with_their_payloads(db: JobDB) -> None:
    """The console's latency to delivered: when each succeeded and its payload, newest first."""
    db.add(jobs(14), query_id="q", batch_id=0)  # two datasets of 10 rows at most
    pending = db.pending("web/hook")
    db.record([Transition(job.id, EXECUTING, 1) for job in pending])
    db.record([Transition(job.id, SUCCEEDED, 1, status_code=200) for job in pending[:12]])
    before = time.time() - 60
    found = db.recent_successes(before, 5)
    assert len(found) == 5 and all(at > before for at, _ in found)
    assert [payload for _, payload in found] == [job.payload for job in pending[11:6:-1]]
    assert len(db.recent_successes(before, 100)) == 12
    assert db.recent_successes(time.time() + 1, 100) == []


def test_every_listed_backend_has_a_test_jobdb(tmp_path: Path) -> None:
    assert BACKENDS == ["sqlite", "postgresql", "mysql"]
    with pytest.raises(AssertionError, match="no test JobDB"), jobdb_url("oracle", tmp_path):
        pass


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://x", "is not understood"),
        ("nothing", "is not understood"),
        ("mysql://root:hunter2@h/db?x=1&nope", ""),
    ],
)
def test_open_jobdb_refuses_unknown_urls_in_one_line(url: str, message: str) -> None:
    from exactly.errors import ConfigError

    if not message:
        assert open_jobdb(url).describe() == "mysql://root:***@h/db?x=1&nope"
        return
    with pytest.raises(ConfigError, match=message) as caught:
        open_jobdb(url)
    assert "\n" not in str(caught.value)


def test_jobs_of_a_destination_carry_their_outcome(db: JobDB) -> None:
    db.add(jobs(3) + jobs(2, destination="other", start=3), query_id="q", batch_id=0)
    found = db.jobs_of("hook")
    assert [job.message_id for job in found] == ["m0", "m1", "m2"]
    first, second, _ = found
    db.record([Transition(first.id, EXECUTING, 1), Transition(second.id, EXECUTING, 1)])
    db.record([Transition(first.id, EXPIRED, 1), Transition(first.id, "archiving", 1)])
    states = {job.message_id: job.state for job in db.jobs_of("hook")}
    assert states == {"m0": EXPIRED, "m1": EXECUTING, "m2": AWAITING_SCHEDULING}
    assert [job.message_id for job in db.jobs_of("hook", after=first.id, limit=1)] == ["m1"]


def test_move_marker_only_raises_it(db: JobDB) -> None:
    assert db.marker("replay:k") is None
    db.move_marker("replay:k", 5)
    db.move_marker("replay:k", 3)
    assert db.marker("replay:k") == 5
    db.move_marker("replay:k", 9)
    assert db.marker("replay:k") == 9


def dataset_tables(db: JobDB) -> set[int]:
    from exactly.delivery.jobdb.sql import SQLJobDB

    assert isinstance(db, SQLJobDB)
    with db._mutex:
        found = db._dataset_tables(db._cursor())
        db._connection.commit()
    return {number for _, number in found}


def test_tables_a_crash_left_unlisted_are_dropped(db: JobDB) -> None:
    from exactly.delivery.jobdb.sql import SQLJobDB

    assert isinstance(db, SQLJobDB)
    for batch in range(3):
        db.add(jobs(10, start=10 * batch), query_id="q", batch_id=batch)
    first = [job.id for job in db.pending("web/hook", limit=10)]
    db.record([Transition(job_id, SUCCEEDED, 1) for job_id in first])
    with db._mutex:
        cursor = db._cursor()
        # a crash in archive's step 4: dataset 1 forgotten, its transitions dropped, not its jobs
        db._execute(cursor, "DELETE FROM jobdb_datasets WHERE number = 1")
        db._connection.commit()
        db._execute(cursor, "DROP TABLE job_state_transitions_1")
        db._connection.commit()
        # a crash between creating dataset 4's tables and registering it
        db._create_dataset(cursor, 4)
    assert dataset_tables(db) == {1, 2, 3, 4}
    assert db.drop_orphans() == [1, 4]
    assert dataset_tables(db) == {2, 3} and [d.number for d in db.datasets()] == [2, 3]
    assert db.drop_orphans() == []
    assert db.add(jobs(10, start=30), query_id="q", batch_id=3) == 10  # dataset 4 made anew
    assert dataset_tables(db) == {2, 3, 4}
    assert len(db.pending("web/hook", limit=100)) == 30


def test_dropping_orphans_never_takes_a_dataset_a_router_is_registering(url: str) -> None:
    """A router rolls a new dataset with every add while another JobDB drops orphans in a loop:
    every job added is still there."""
    import random
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def cleaner() -> None:
        try:
            with open_jobdb(url) as other:
                while not stop.is_set():  # a director starting every few milliseconds
                    other.drop_orphans()
                    time.sleep(random.uniform(0.002, 0.02))
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    with open_jobdb(url, dataset_rows=2) as router:
        router.add(jobs(2), query_id="q", batch_id=0)
        thread = threading.Thread(target=cleaner)
        thread.start()
        try:
            for batch in range(1, 20):
                assert router.add(jobs(2, start=2 * batch), query_id="q", batch_id=batch) == 2
        finally:
            stop.set()
            thread.join(60)
        assert not errors, errors
        found = router.pending("web/hook", limit=1000)
        assert [job.message_id for job in found] == [f"m{i}" for i in range(40)]
        assert len(router.datasets()) == 20


def _hold_replay(url: str, ready: Any) -> None:
    with open_jobdb(url).replay_lock("hook"):
        ready.set()
        time.sleep(600)


def test_one_replay_of_a_destination_at_a_time(url: str) -> None:
    from exactly.errors import ReplayRunning

    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_hold_replay, args=(url, ready))
    holder.start()
    try:
        assert ready.wait(60)
        db = open_jobdb(url)
        with (
            pytest.raises(ReplayRunning, match="another replay of 'hook'"),
            db.replay_lock("hook"),
        ):
            pass
        with db.replay_lock("other"):  # another destination's replay may run
            pass
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(30)
        deadline = time.monotonic() + 10
        while True:  # the server notices the closed connection a moment later
            try:
                with db.replay_lock("hook"):
                    break
            except ReplayRunning:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        db.close()
    finally:
        if holder.is_alive():
            holder.kill()


@pytest.mark.parametrize("url", ["postgresql", "mysql"], indirect=True)
def test_a_replay_lock_is_free_before_its_connection_closes(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Left normally or by an error, a server's lock is given back before its connection closes:
    the server frees a closed connection's locks only a moment after the client has gone on,
    and a loaded one refused the next backfill of the same destination in the same process.
    (SQLite's flock goes with the file's close itself.)"""
    from exactly.errors import ReplayRunning

    if url.startswith("postgresql"):
        import psycopg

        connection_class: Any = psycopg.Connection
    else:
        import pymysql

        connection_class = pymysql.connections.Connection
    db, other = open_jobdb(url), open_jobdb(url)
    found: list[str] = []
    checking = False
    close = connection_class.close

    def checked_close(self: Any) -> None:  # as the lock's connection closes: is it free?
        nonlocal checking
        if not checking:
            checking = True
            try:
                with other.replay_lock("hook"):
                    found.append("free")
            except ReplayRunning:
                found.append("held")
            finally:
                checking = False
        close(self)

    monkeypatch.setattr(connection_class, "close", checked_close)
    with db.replay_lock("hook"):
        pass
    with contextlib.suppress(KeyError), db.replay_lock("hook"):
        raise KeyError
    monkeypatch.undo()
    assert found == ["free", "free"]
    db.close()
    other.close()


def _lease(url: str, partitions: list[int], ready: Any) -> None:
    db = open_jobdb(url)
    assert all(db.take_partition(partition) for partition in partitions)
    db.heartbeat("holder", partitions, time.time())
    ready.set()
    time.sleep(600)


def test_a_partition_has_one_holder_and_a_holders_death_frees_it(url: str) -> None:
    """Partition leases (many directors): another process's lease is refused, other
    partitions are free, a release frees one at once, and a SIGKILL frees the holder's."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    holder = context.Process(target=_lease, args=(url, [0, 2], ready))
    holder.start()
    try:
        assert ready.wait(60)
        db, other = open_jobdb(url), open_jobdb(url)
        assert not db.take_partition(0) and not db.take_partition(2)
        assert db.take_partition(1) and db.take_partition(1)  # taking one held here: held
        assert not other.take_partition(1)  # another JobDB object (connection) of this process
        assert db.held_partitions() == {1}
        db.keep_partitions()
        db.release_partition(1)
        assert other.take_partition(1) and db.held_partitions() == set()
        with pytest.raises(DirectorLockHeld, match="partition 0"), db.all_partitions(3):
            pass
        assert db.held_partitions() == set()  # the ones it took on the way are released
        assert ("holder", [0, 2]) in [(name, held) for name, held, _ in db.directors()]
        assert db.heartbeat("me", [], time.time()) == 2  # the holder and this one
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(30)
        other.release_partition(1)
        deadline = time.monotonic() + 10
        while not (db.take_partition(0) and db.take_partition(2)):
            assert time.monotonic() < deadline  # the server notices the closed connection
            time.sleep(0.1)
        with db.all_partitions(3):
            assert db.held_partitions() == {0, 1, 2}
        db.leave("me")
        assert "me" not in [name for name, _, _ in db.directors()]
        db.close()
        other.close()
    finally:
        if holder.is_alive():
            holder.kill()


def test_processes_opening_a_new_jobdb_together_all_go_on(url: str) -> None:
    """``exactly up`` starts the route query and its directors at once on a new JobDB: each
    creates the JobDB's tables if missing, and none of them fails for the others doing so."""
    opened = [open_jobdb(url) for _ in range(8)]
    try:
        assert _all_at_once(opened, lambda db, _: db.datasets()) == []
        assert [dataset.number for dataset in opened[0].datasets()] == [1]
    finally:
        for db in opened:
            db.close()


def test_directors_starting_together_make_their_tables_once(url: str) -> None:
    """The directors' and the destinations' tables are made at a director's first heartbeat
    and first look at its controls: several directors starting at once all go on (PostgreSQL
    fails one of two concurrent CREATE TABLE IF NOT EXISTS with a unique violation)."""
    count = 8
    opened = [open_jobdb(url) for _ in range(count)]
    for db in opened:
        db.datasets()  # connected, the JobDB's own tables made: only the lazy ones race

    def first_steps(db: JobDB, i: int) -> None:
        db.heartbeat(f"d{i}", [], time.time())
        db.controls()

    try:
        assert _all_at_once(opened, first_steps) == []
        assert len(opened[0].directors()) == count
    finally:
        for db in opened:
            db.close()


def _all_at_once(opened: list[JobDB], step: Callable[[JobDB, int], object]) -> list[BaseException]:
    """Run ``step(db, i)`` for each JobDB in a thread of its own, all released at one barrier;
    what they raised."""
    import threading

    start = threading.Barrier(len(opened))
    failures: list[BaseException] = []

    def run(db: JobDB, i: int) -> None:
        try:
            start.wait()
            step(db, i)
        except BaseException as error:  # noqa: BLE001 - returned to the test
            failures.append(error)

    threads = [threading.Thread(target=run, args=(db, i)) for i, db in enumerate(opened)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return failures


def test_a_lease_is_taken_again_on_a_new_connection_or_reported_lost(url: str) -> None:
    """A lease lives on the connection the director writes on (sqlite: a file lock, which no
    connection carries): after the connection is lost, the next statement takes it again, or
    raises PartitionLost if another took it meanwhile (the director then stops)."""
    from exactly.errors import PartitionLost

    db, rival = open_jobdb(url), open_jobdb(url)
    assert db.take_partition(3)
    db.close()  # as a terminated backend would: the session's locks are gone
    db.keep_partitions()
    assert db.held_partitions() == {3} and not rival.take_partition(3)
    if url.startswith("sqlite"):
        return  # an flock outlives the connection: nothing can take it meanwhile
    db.close()
    # the server frees a closed session's locks as it tears the session down: soon, not at once
    deadline = time.monotonic() + 10
    while not rival.take_partition(3):
        assert time.monotonic() < deadline, "the closed connection's lease was never freed"
        time.sleep(0.05)
    with pytest.raises(PartitionLost, match="partitions 3 of"):
        db.keep_partitions()
    assert db.held_partitions() == set()
    db.close()
    rival.close()


def test_forgetting_jobs_expires_the_queued_and_empties_every_one(db: JobDB, url: str) -> None:
    """``exactly forget``: u1's jobs (m1, m4, ... over two datasets) and m2 by its message id."""
    db.add(jobs(8), query_id="q", batch_id=0)
    db.add(jobs(8, start=8), query_id="q", batch_id=1)  # a second dataset (10 rows each)
    pending = {job.message_id: job for job in db.pending("web/hook", limit=100)}
    db.record(
        [
            Transition(pending["m1"].id, SUCCEEDED, 1, status_code=400, response="echo u1 m1"),
            Transition(pending["m4"].id, AWAITING_RETRY, 1, retry_at=1.0, response="u1 said"),
            Transition(pending["m3"].id, SUCCEEDED, 1, response="fine"),
        ]
    )
    picked: list[tuple[str, str | None]] = []

    def matches(message_id: str, user_id: str | None, payload: bytes) -> bool:
        picked.append((message_id, user_id))
        return user_id == "u1" or message_id == "m2"

    expired, emptied = db.forget_jobs(matches)
    theirs = {f"m{i}" for i in range(16) if i % 3 == 1} | {"m2"}
    assert emptied == len(theirs) and expired == len(theirs) - 1  # m1 had succeeded
    assert {message for message, _ in picked} == {f"m{i}" for i in range(16)}
    left = {job.message_id for job in db.pending("web/hook", limit=100)}
    assert left == {f"m{i}" for i in range(16)} - theirs - {"m3"}
    for message_id in sorted(theirs):
        ((job, history),) = db.jobs_with(message_id)
        assert job.payload == b"" and job.user_id is None
        assert all(step.response is None for step in history)
        if message_id != "m1":
            assert (history[-1].state, history[-1].error_type) == (EXPIRED, "forgotten")
    ((kept, kept_history),) = db.jobs_with("m3")
    assert kept.payload and kept_history[-1].response == "fine"
    assert db.forget_jobs(matches) == (0, 0)  # once more: nothing left to pick
    if url.startswith("sqlite"):  # no old copy in the file or its write-ahead log
        directory = Path(url.partition("://")[2])
        for path in directory.glob("jobdb.sqlite*"):
            assert b"echo u1 m1" not in path.read_bytes(), path


def packed_jobs(sizes: list[int], *, start: int = 0) -> list[NewJob]:
    """Packs of ``sizes`` members each, as the route query makes them (docs/delivery.md)."""
    made: list[NewJob] = []
    at = start
    for size in sizes:
        members = [
            packs.Member(f"m{i}", f"u{i % 3}", b'{"messageId":"m%d"}' % i)
            for i in range(at, at + size)
        ]
        at += size
        key = packs.pack_key("hook", (m.message_id for m in members))
        made.append(NewJob("web", "hook", packs.pack(members), key))
    return made


def test_a_pack_is_one_job_that_counts_and_fills_by_its_events(db: JobDB) -> None:
    # dataset_rows is 10: a dataset fills by events, so a pack of 6 then one of 5 roll it
    assert db.add(packed_jobs([6]) + jobs(1, start=100), query_id="q", batch_id=0) == 2
    assert db.add(packed_jobs([5], start=6), query_id="q", batch_id=1) == 1
    assert [(d.number, d.rows) for d in db.datasets()] == [(1, 7), (2, 5)]
    pack, single, second = db.pending("web/hook")
    assert (pack.events, single.events, second.events) == (6, 1, 5)
    assert single.id == pack.id + 6  # a pack takes an id per member
    assert pack.packed and pack.user_id is None and pack.message_id.startswith("pack_")
    assert packs.message_ids(second.payload) == [f"m{i}" for i in range(6, 11)]
    db.record([Transition(pack.id, EXECUTING, 1, time=time.time())])
    db.record([Transition(pack.id, SUCCEEDED, 1, time=time.time(), status_code=200)])
    summary = db.summary()["hook"]
    assert summary.states == {SUCCEEDED: 6, AWAITING_SCHEDULING: 6}
    assert summary.succeeded_last_minute == 6
    recent = db.recent_successes(time.time() - 60, 4)
    assert [payload for _, payload in recent] == [b'{"messageId":"m%d"}' % i for i in range(4)]


def test_a_pack_is_traced_archived_and_forgotten_by_its_members(db: JobDB) -> None:
    db.add(packed_jobs([8]), query_id="q", batch_id=0)
    db.add(packed_jobs([3], start=8), query_id="q", batch_id=1)  # 11 events: a second dataset
    first, second = db.pending("web/hook")
    # trace: a member's message id finds its pack, as stored, with its transitions
    db.record([Transition(second.id, EXECUTING, 1)])
    found = db.jobs_with("m9")
    assert [(job.id, [t.state for t in steps]) for job, steps in found] == [
        (second.id, [EXECUTING])
    ]
    assert db.jobs_with("m20") == [] and [job.id for job, _ in db.jobs_with("m0")] == [first.id]
    # forget: a pack loses only the person's members (u1's: m1, m4, m7, m10; and m9)
    expired, emptied = db.forget_jobs(lambda mid, uid, payload: uid == "u1" or mid == "m9")
    assert (expired, emptied) == (0, 5)
    first, second = db.pending("web/hook")
    assert packs.message_ids(first.payload) == ["m0", "m2", "m3", "m5", "m6"]
    assert packs.message_ids(second.payload) == ["m8"]
    assert db.summary()["hook"].states == {AWAITING_SCHEDULING: 5, EXECUTING: 1}
    # archive: a record per member, each with its pack's key and transitions
    db.record([Transition(first.id, SUCCEEDED, 1, status_code=200)])
    archived: list[dict[str, Any]] = []
    db.archive(1, archived.extend)
    assert [(r["message_id"], r["user_id"], r["batch"]) for r in archived] == [
        (f"m{i}", f"u{i % 3}", first.message_id) for i in (0, 2, 3, 5, 6)
    ]
    assert json.loads(archived[1]["payload"]) == {"messageId": "m2"}
    assert [step["state"] for step in archived[0]["transitions"]] == [SUCCEEDED, "archiving"]


def test_a_dataset_made_before_packs_counts_a_job_each_and_takes_none(db: JobDB, url: str) -> None:
    """A JobDB made by an older version: its jobs tables have no ``events`` column."""
    db.add(jobs(2), query_id="q", batch_id=0)
    db.close()
    _drop_events_column(url, 1)
    with open_jobdb(url, dataset_rows=10) as older:
        assert older.summary()["hook"].states == {AWAITING_SCHEDULING: 2}
        older.add(packed_jobs([3], start=2), query_id="q", batch_id=1)
        assert [d.number for d in older.datasets()] == [1, 2]  # a new dataset took the pack
        assert older.summary()["hook"].states == {AWAITING_SCHEDULING: 5}
        assert [job.id for job, _ in older.jobs_with("m3")] == [older.datasets()[1].first_id]


def _drop_events_column(url: str, number: int) -> None:
    """Make dataset ``number``'s jobs table as a JobDB before packs made it."""
    columns = "id, bucket, destination, payload, message_id, user_id, created_at, expire_at"
    with open_jobdb(url) as db:
        cursor = db._cursor()
        for statement in (
            f"CREATE TABLE old_jobs AS SELECT {columns} FROM jobs_{number}",
            f"DROP TABLE jobs_{number}",
            f"CREATE TABLE jobs_{number} AS SELECT {columns} FROM old_jobs",
            "DROP TABLE old_jobs",
        ):
            cursor.execute(statement)
        db._connection.commit()


def test_a_large_micro_batch_goes_in_whole_across_statements(url: str) -> None:
    # more jobs than one insert statement's rows, and packs past its bytes: every job once,
    # ids in order, a pack taking an id per member
    single = JobRun(
        "hook",
        ["web"] * 2_500,
        [b'{"messageId":"m%d"}' % i for i in range(2_500)],
        [f"m{i}" for i in range(2_500)],
        [f"u{i % 7}" for i in range(2_500)],
        lanes=[i % 2 for i in range(2_500)],
    )
    big = [  # 3 packs of 400 members of ~1 KiB: above STATEMENT_BYTES together
        packs.pack(
            [
                packs.Member(f"p{i}", None, b'{"messageId":"p%d","pad":"%s"}' % (i, b"x" * 1000))
                for i in range(at, at + 400)
            ]
        )
        for at in range(0, 1_200, 400)
    ]
    bodies = [NewJob("web", "bulk", body, f"pack_{n}") for n, body in enumerate(big)]
    with open_jobdb(url) as db:
        assert sum(map(len, big)) > STATEMENT_BYTES
        added = db.add(RoutedJobs([*bodies[:1], single, *bodies[1:]]), query_id="q", batch_id=0)
        assert added == 2_503
        lane0, lane1 = db.pending("web/hook"), db.pending("web/1/hook")
        assert len(lane0) == len(lane1) == 1_250
        found = sorted(lane0 + lane1, key=lambda job: job.id)
        assert [job.message_id for job in found] == [f"m{i}" for i in range(2_500)]
        assert [job.payload for job in found[:2]] == [b'{"messageId":"m0"}', b'{"messageId":"m1"}']
        assert found[0].user_id == "u0" and found[-1].id - found[0].id == 2_499
        packs_in = db.pending("web/bulk")
        assert [job.payload for job in packs_in] == big
        assert found[0].id == packs_in[0].id + 400  # the first pack's 400 ids come before
        assert packs_in[1].id == found[-1].id + 1 and packs_in[2].id == packs_in[1].id + 400
        assert sum(db.states()["bulk"].values()) == 1_200
        now = time.time()  # the director's write: as many transitions at once
        db.record([Transition(job.id, EXECUTING, 1, time=now) for job in found])
        db.record([Transition(job.id, SUCCEEDED, 1, time=now, status_code=200) for job in found])
        assert db.states()["hook"] == {SUCCEEDED: 2_500}
