"""The director against real HTTP receivers on loopback: each path ends in the right state."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from exactly.delivery.director import Director
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    SUCCEEDED,
    Job,
    NewJob,
    Transition,
)
from exactly.delivery.settings import DestinationSettings
from tests.receiver import Receiver
from tests.servers import free_port

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def db(tmp_path: Path) -> Iterator[JobDB]:
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as opened:
        yield opened


def destination(name: str, url: str, **options: Any) -> DestinationSettings:
    settings: dict[str, Any] = {
        "name": name,
        "url": url,
        "secret": SECRET,
        "timeout": 1.0,
        "backoff": {"min": 0.05, "max": 0.2},
        **options,
    }
    return DestinationSettings.model_validate(settings)


def enqueue(
    db: JobDB, target: DestinationSettings, count: int, *, batch: int = 0, expire: float = 60
) -> None:
    now = time.time()
    db.add(
        [
            NewJob(
                source="web",
                destination=target.name,
                payload=json.dumps({"messageId": f"{target.name}-{i}", "n": i}).encode(),
                message_id=f"{target.name}-{i}",
                user_id=f"u{i % 2}",
                expire_at=now + expire,
            )
            for i in range(count)
        ],
        query_id=f"test-{target.name}",
        batch_id=batch,
    )


def run(db: JobDB, *targets: DestinationSettings) -> Director:
    director = Director(db, targets, poll_seconds=0.05, report=lambda _: None)
    director.run(until_drained=True)
    return director


def final_states(db: JobDB, name: str) -> dict[str, int]:
    return db.states().get(name, {})


def attempts(db: JobDB, job_id: int) -> list[tuple[str, int, int | None]]:
    return [(step.state, step.attempt, step.status_code) for step in db.history(job_id)]


def test_success_carries_every_header_and_a_valid_signature(db: JobDB, receiver: Receiver) -> None:
    target = destination("ok", f"{receiver.url}/ok", headers={"Authorization": "Bearer t"})
    enqueue(db, target, 5)
    run(db, target)
    assert final_states(db, "ok") == {SUCCEEDED: 5}
    assert sorted(receiver.ids().values()) == [1] * 5
    webhook = Webhook(SECRET)
    for request in receiver.requests:
        headers = request.headers
        assert headers["Idempotency-Key"] == headers["webhook-id"]
        assert headers["Authorization"] == "Bearer t"
        assert headers["Content-Type"] == "application/json"
        assert webhook.verify(request.body, headers)["messageId"] == headers["webhook-id"]
    first = db.history(1)
    assert [(s.state, s.attempt, s.status_code) for s in first] == [
        (EXECUTING, 1, None),
        (SUCCEEDED, 1, 200),
    ]


def test_server_errors_are_retried_until_they_pass(jobdb: JobDB, receiver: Receiver) -> None:
    target = destination("flaky", f"{receiver.url}/flaky/2")
    enqueue(jobdb, target, 3)
    run(jobdb, target)
    assert final_states(jobdb, "flaky") == {SUCCEEDED: 3}
    assert sorted(receiver.ids().values()) == [3, 3, 3]
    assert attempts(jobdb, 1) == [
        (EXECUTING, 1, None),
        (AWAITING_RETRY, 1, 500),
        (EXECUTING, 2, None),
        (AWAITING_RETRY, 2, 500),
        (EXECUTING, 3, None),
        (SUCCEEDED, 3, 200),
    ]


def test_429_waits_for_retry_after(jobdb: JobDB, receiver: Receiver) -> None:
    target = destination("throttled", f"{receiver.url}/throttle/1")
    enqueue(jobdb, target, 2)
    run(jobdb, target)
    assert final_states(jobdb, "throttled") == {SUCCEEDED: 2}
    for message_id in receiver.ids():
        times = [r.at for r in receiver.requests if r.headers["webhook-id"] == message_id]
        assert len(times) == 2 and times[1] - times[0] >= 0.95  # Retry-After: 1, not 0.05 s
    history = jobdb.history(1)
    assert history[1].state == AWAITING_RETRY and history[1].status_code == 429
    assert history[1].retry_at is not None and history[1].retry_at - history[1].time >= 1


def test_client_errors_are_discarded_with_the_response(db: JobDB, receiver: Receiver) -> None:
    target = destination("refused", f"{receiver.url}/status/400")
    enqueue(db, target, 2)
    run(db, target)
    assert final_states(db, "refused") == {DISCARDED: 2}
    assert sorted(receiver.ids().values()) == [1, 1]
    step = db.history(1)[-1]
    assert (step.state, step.attempt, step.status_code) == (DISCARDED, 1, 400)
    assert step.response is not None and step.response.startswith("status 400")
    assert len(step.response) == 1024


@pytest.mark.parametrize("path", ["/status/408", "/status/503", "/hang/3"])
def test_retried_answers_expire(db: JobDB, receiver: Receiver, path: str) -> None:
    target = destination("failing", f"{receiver.url}{path}", timeout=0.3)
    enqueue(db, target, 2, expire=1.5)
    run(db, target)
    assert final_states(db, "failing") == {EXPIRED: 2}
    history = db.history(1)
    tries = [step for step in history if step.state == EXECUTING]
    assert len(tries) >= 2
    retried = [step for step in history if step.state == AWAITING_RETRY]
    if path.startswith("/hang"):
        assert {step.error_type for step in retried} == {"timeout"}
    else:
        assert {step.status_code for step in retried} == {int(path.rsplit("/", 1)[1])}
    assert history[-1].state == EXPIRED
    assert len(receiver.ids()) == 2


def test_refused_connections_are_retried(jobdb: JobDB) -> None:
    target = destination("nobody", f"http://127.0.0.1:{free_port()}/in")
    enqueue(jobdb, target, 1, expire=3.0)  # a loaded machine (CI) took 0.8 s to the first try
    run(jobdb, target)
    assert final_states(jobdb, "nobody") == {EXPIRED: 1}
    retried = [step for step in jobdb.history(1) if step.state == AWAITING_RETRY]
    assert retried and all(step.error_type == "refused" for step in retried)


def test_a_crash_left_executing_is_sent_again(db: JobDB, receiver: Receiver) -> None:
    target = destination("resumed", f"{receiver.url}/ok")
    enqueue(db, target, 3)
    (job, *_) = db.pending("web/resumed")
    db.record([Transition(job.id, EXECUTING, 1)])  # a director died after step 1
    run(db, target)
    assert final_states(db, "resumed") == {SUCCEEDED: 3}
    assert attempts(db, job.id) == [(EXECUTING, 1, None), (EXECUTING, 2, None), (SUCCEEDED, 2, 200)]


def test_one_destination_down_does_not_slow_another(jobdb: JobDB) -> None:
    with Receiver() as fast, Receiver(delay=0.0) as down:
        down.down = True
        good = destination("good", f"{fast.url}/ok", max_in_flight=4)
        bad = destination("bad", f"{down.url}/flap", max_in_flight=4, timeout=0.5)
        enqueue(jobdb, bad, 2000, expire=600)
        enqueue(jobdb, good, 300)
        director = Director(jobdb, [good, bad], poll_seconds=0.05, report=lambda _: None)
        import threading

        runner = threading.Thread(target=director.run, kwargs={"until_drained": True})
        started = time.time()
        runner.start()
        deadline = started + 60
        while final_states(jobdb, "good").get(SUCCEEDED, 0) < 300 and time.time() < deadline:
            time.sleep(0.05)
        good_done = time.time() - started
        assert final_states(jobdb, "good") == {SUCCEEDED: 300}
        assert good_done < 15
        down.down = False  # the bad one recovers and its backlog drains
        runner.join(120)
        assert not runner.is_alive()
        assert final_states(jobdb, "bad") == {SUCCEEDED: 2000}
        assert set(down.ids("/flap")) == {f"bad-{i}" for i in range(2000)}


def test_finished_datasets_are_archived_then_dropped(tmp_path: Path, receiver: Receiver) -> None:
    from exactly.delivery.archive import open_archive

    # a whole second to answer (this file's default) can pass on a loaded machine, and a retry
    # would add steps to the transitions checked below: this test is about archiving
    target = destination("kept", f"{receiver.url}/ok", timeout=30.0)
    refusing = destination("refusing", f"{receiver.url}/status/404", timeout=30.0)
    with open_jobdb(f"sqlite://{tmp_path / 'small'}", dataset_rows=50) as db:
        for batch in range(4):
            enqueue(db, target, 40, batch=batch)  # 40 per micro-batch: one dataset each
        enqueue(db, refusing, 10)
        archive = open_archive(f"file://{tmp_path / 'archive'}")
        director = Director(
            db, [target, refusing], poll_seconds=0.05, report=lambda _: None, archive=archive
        )
        director.run(until_drained=True)
        # datasets 1 to 3 (40 jobs each) archived; the newest (40 + the 10 refused) stays
        assert [dataset.number for dataset in db.datasets()] == [4]
        files = sorted((tmp_path / "archive").iterdir())
        assert len(files) == 3 and director.archived == 3
        assert [path.name for path in files] == archive.names()
        records = [record for name in archive.names() for record in archive.records(name)]
        assert len(records) == 120
        assert {r["destination"] for r in records} == {"kept"}
        first = records[0]
        assert first["payload"].startswith('{"messageId"')
        assert [step["state"] for step in first["transitions"]] == [
            EXECUTING,
            SUCCEEDED,
            "archiving",
        ]
        assert final_states(db, "refusing") == {DISCARDED: 10}
    import sqlite3

    with sqlite3.connect(tmp_path / "small" / "jobdb.sqlite") as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert "jobs_4" in tables and not {"jobs_1", "jobs_2", "jobs_3"} & tables
    assert not {f"job_state_transitions_{n}" for n in (1, 2, 3)} & tables


def test_a_jobdb_that_refuses_writes_stops_the_director(tmp_path: Path, receiver: Receiver) -> None:
    from exactly.delivery.jobdb.sqlite import SqliteJobDB
    from exactly.errors import JobDBError

    class Failing(SqliteJobDB):
        writes = 0

        def record(self, transitions: Any) -> None:
            Failing.writes += 1
            if Failing.writes > 2:
                raise OSError(28, "No space left on device")
            super().record(transitions)

    target = destination("full", f"{receiver.url}/ok", max_in_flight=2)
    with Failing(f"sqlite://{tmp_path / 'jobdb'}") as db:
        enqueue(db, target, 50)
        director = Director(
            db, [target], poll_seconds=0.05, report=lambda _: None, jobdb_patience=1.0
        )
        started = time.time()
        with pytest.raises(JobDBError, match=r"failed \(OSError: .*No space left.* within 1 s"):
            director.run(until_drained=True)
        assert time.time() - started < 30
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as again:  # nothing lost: resumed later
        run(again, target)
        assert final_states(again, "full") == {SUCCEEDED: 50}


def test_jobs_are_paged_in_runs_not_per_answer(tmp_path: Path, receiver: Receiver) -> None:
    """A bucket pages more in once it has room for a run of jobs: paging whenever an answer freed
    room made a JobDB query per answer or two, and the outcomes' commits waited behind them."""
    from exactly.delivery.jobdb.sqlite import SqliteJobDB

    pages: list[int] = []

    class Counting(SqliteJobDB):
        def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
            found = super().pending(bucket, after=after, limit=limit)
            pages.append(len(found))
            return found

    target = destination("paged", f"{receiver.url}/ok", max_in_flight=8)
    with Counting(f"sqlite://{tmp_path / 'jobdb'}") as db:
        enqueue(db, target, 2_000)
        director = Director(db, [target], page_size=200, poll_seconds=0.05, report=lambda _: None)
        director.run(until_drained=True)
        assert final_states(db, "paged") == {SUCCEEDED: 2_000}
    assert sum(pages) == 2_000
    # about 11 pages that found jobs (the code before made 399, of 1 to 8 jobs)
    assert len([found for found in pages if found]) <= 40, pages
