"""A batching destination (``[destinations.batch]``) against real receivers on loopback.

Each batch is formed once and recorded before it leaves: a retry carries the same
Idempotency-Key / webhook-id and the same members, and every event is in exactly one batch
that succeeded.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from exactly.config import Settings
from exactly.delivery.director import Director
from exactly.delivery.jobdb import JobDB, open_jobdb
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    EXECUTING,
    SUCCEEDED,
    Batch,
    BatchStep,
    Members,
    NewJob,
)
from exactly.delivery.settings import DestinationSettings
from exactly.trace import Trace, _delivered, render
from tests.receiver import Received, Receiver

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture
def db(tmp_path: Path) -> Iterator[JobDB]:
    with open_jobdb(f"sqlite://{tmp_path / 'jobdb'}") as opened:
        yield opened


def destination(url: str, **batch: Any) -> DestinationSettings:
    options = {"max_events": 50, "max_wait": "200ms", **batch}
    ordered = bool(options.pop("ordered", False))
    return DestinationSettings.model_validate(
        {
            "name": "batched",
            "url": url,
            "secret": SECRET,
            "timeout": 2.0,
            "max_in_flight": 4,
            "ordered": ordered,
            "backoff": {"min": 0.05, "max": 0.2},
            "batch": options,
        }
    )


def enqueue(db: JobDB, count: int, *, users: int = 3, pad: int = 0, start: int = 0) -> None:
    db.add(
        [
            NewJob(
                source="web",
                destination="batched",
                payload=json.dumps(
                    {"messageId": f"m{i}", "userId": f"u{i % users}", "n": i, "pad": "x" * pad}
                ).encode(),
                message_id=f"m{i}",
                user_id=f"u{i % users}",
                expire_at=time.time() + 120,
            )
            for i in range(start, start + count)
        ],
        query_id="test",
        batch_id=start,
    )


def run(db: JobDB, target: DestinationSettings) -> Director:
    director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
    director.run(until_drained=True)
    return director


def events_of(request: Received) -> list[dict[str, Any]]:
    if request.headers["Content-Type"] == "application/x-ndjson":
        return [json.loads(line) for line in request.body.splitlines()]
    document = json.loads(request.body)
    return document["batch"] if isinstance(document, dict) else document


def test_every_event_is_in_one_successful_batch_and_retries_resend_the_same_batch(
    db: JobDB, receiver: Receiver, tmp_path: Path
) -> None:
    target = destination(f"{receiver.url}/unlucky/3")
    enqueue(db, 1_000)
    director = run(db, target)
    assert db.states() == {"batched": {SUCCEEDED: 1_000}}
    webhook = Webhook(SECRET)
    members: dict[str, list[str]] = {}
    delivered: list[str] = []
    for request in receiver.requests:
        key = request.headers["webhook-id"]
        assert request.headers["Idempotency-Key"] == key and key.startswith("batch_")
        webhook.verify(request.body, request.headers)  # raises if the signature is wrong
        ids = [event["messageId"] for event in events_of(request)]
        assert 1 <= len(ids) <= 50
        assert members.setdefault(key, ids) == ids  # every attempt: the same members, in order
        if 200 <= request.status < 300:
            delivered += ids
    assert sorted(delivered) == sorted(f"m{i}" for i in range(1_000))  # each exactly once
    assert set(receiver.successes().values()) == {1}
    retried = [key for key, count in receiver.ids().items() if count > 1]
    assert retried, "the receiver failed no batch"
    assert all(receiver.ids()[key] == 2 for key in retried)
    assert len(members) <= 1_000 // 50 + 4 * 2  # full batches but for partial ones at the ends
    tally = director.tallies["batched"]
    assert (tally.sent, tally.succeeded) == (len(receiver.requests), 1_000)
    # the JobDB: a member has one transition, its end, however often its batch was tried
    batch, steps = db.batch_history(retried[0]) or (None, [])
    assert batch is not None and [s.state for s in steps] == [
        EXECUTING,
        AWAITING_RETRY,
        EXECUTING,
        SUCCEEDED,
    ]
    assert [s.state for s in db.history(batch.job_ids[0])] == [SUCCEEDED]
    assert db.history(batch.job_ids[0])[0].attempt == 2
    # exactly trace: the batch a member went in, and the batch's attempts as the job's
    assert db.batch_of("batched", batch.job_ids[0]) == batch.id
    assert db.batch_of("elsewhere", batch.job_ids[0]) is None
    (job, _), *_ = db.jobs_with(members[batch.id][0])
    traced = Trace(job.message_id)
    _delivered(Settings(data_dir=tmp_path), job.message_id, traced)  # the db fixture's JobDB
    (delivery,) = traced.deliveries
    assert delivery.batch == batch.id and delivery.state == SUCCEEDED
    assert [a.state for a in delivery.attempts] == [AWAITING_RETRY, SUCCEEDED]
    assert [a.status_code for a in delivery.attempts] == [500, 200]
    assert f"    in batch {batch.id}" in render(traced).splitlines()


def test_a_partial_batch_waits_max_wait_then_leaves(db: JobDB, receiver: Receiver) -> None:
    target = destination(f"{receiver.url}/ok", max_wait="400ms")
    enqueue(db, 7)
    started = time.monotonic()
    run(db, target)
    (request,) = receiver.requests
    assert len(events_of(request)) == 7
    assert 0.35 <= request.at - started < 3.0


def test_ndjson_batches_keep_max_bytes(db: JobDB, receiver: Receiver) -> None:
    target = destination(f"{receiver.url}/ok", max_bytes=2048, format="ndjson")
    enqueue(db, 100, pad=200)
    run(db, target)
    assert db.states() == {"batched": {SUCCEEDED: 100}}
    sizes = [len(request.body) for request in receiver.requests]
    assert max(sizes) <= 2048 and len(sizes) >= 100 * 250 // 2048
    assert {request.headers["Content-Type"] for request in receiver.requests} == {
        "application/x-ndjson"
    }
    got = sorted(event["n"] for request in receiver.requests for event in events_of(request))
    assert got == list(range(100))


def test_ordered_batches_keep_each_users_order_across_failures(
    db: JobDB, receiver: Receiver
) -> None:
    target = destination(f"{receiver.url}/unlucky/2", max_events=10, ordered=True)
    enqueue(db, 300, users=7)
    run(db, target)
    assert db.states() == {"batched": {SUCCEEDED: 300}}
    assert any(count > 1 for count in receiver.ids().values()), "no batch failed"
    seen: dict[str, list[int]] = defaultdict(list)
    for request in sorted(receiver.requests, key=lambda r: r.at):
        if 200 <= request.status < 300:
            for event in events_of(request):
                seen[event["userId"]].append(event["n"])
    assert len(seen) == 7
    for user, numbers in seen.items():
        assert numbers == sorted(numbers), user
        assert len(numbers) == len(set(numbers))


def test_a_restart_resends_open_batches_whole_under_their_ids(tmp_path: Path) -> None:
    """A director stopped with batches recorded (one sent and unanswered, one to retry): the
    next director sends those batches, whole and under the same ids, before any new one."""
    url = f"sqlite://{tmp_path / 'jobdb'}"
    with Receiver() as receiver, open_jobdb(url) as db:
        target = destination(f"{receiver.url}/status/503", max_events=5)
        enqueue(db, 12)
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)

        thread = threading.Thread(target=director.run)
        thread.start()
        deadline = time.monotonic() + 30
        while len(receiver.ids()) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        director.stop()
        thread.join(30)
        first = {
            request.headers["webhook-id"]: [e["messageId"] for e in events_of(request)]
            for request in receiver.requests
        }
        assert len(first) == 3
        open_ids = {found.batch.id for found in db.open_batches("web/batched")}
        assert open_ids == set(first)
        receiver.requests.clear()
        run(db, target.model_copy(update={"url": f"{receiver.url}/ok"}))
        assert db.states() == {"batched": {SUCCEEDED: 12}}
        again = {
            request.headers["webhook-id"]: [e["messageId"] for e in events_of(request)]
            for request in receiver.requests
        }
        assert again == first


def test_a_batch_left_open_with_its_members_executing_ends_with_their_own_attempts(
    db: JobDB, receiver: Receiver
) -> None:
    """A JobDB written before members got no row of their own while their batch is out (each
    member ``executing`` beside the batch's first step), left with that batch in flight: the
    next director sends it whole under its id, and each member ends at its own attempt count
    (the executing row is not counted as an attempt of its own)."""
    enqueue(db, 5)
    jobs = db.pending("web/batched")
    ids = tuple(job.id for job in jobs)
    batch = Batch("batch_left_open", "web/batched", "batched", ids)
    db.record(
        [],
        batches=[batch],
        steps=[BatchStep(batch.id, EXECUTING, 1)],
        members=[Members(ids, EXECUTING, 1)],
    )
    run(db, destination(f"{receiver.url}/ok", max_events=5))
    assert receiver.ids() == {batch.id: 1}
    assert db.states() == {"batched": {SUCCEEDED: 5}}
    for job_id in ids:
        assert [(s.state, s.attempt) for s in db.history(job_id)] == [
            (EXECUTING, 1),
            (SUCCEEDED, 1),
        ]
