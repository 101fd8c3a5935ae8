"""What one request carries (``director/shipment.py``): a job and a batch share one expiry rule
and one outcome, and differ only in the rows that record them and where a retry waits."""

from __future__ import annotations

import pytest

from exactly.delivery.director.queues import Bucket
from exactly.delivery.director.shipment import BatchShipment, JobShipment, Shipment
from exactly.delivery.director.writer import Writes
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    Job,
    Members,
    Transition,
)
from exactly.delivery.settings import DestinationSettings

NOW = 1_000.0


def job(
    number: int, *, attempt: int = 0, expire_at: float = 2_000.0, retry_at: float | None = None
) -> Job:
    payload = b'{"n":%d}' % number
    return Job(
        number,
        "web/d",
        "d",
        payload,
        f"m{number}",
        None,
        0.0,
        expire_at,
        attempt=attempt,
        retry_at=retry_at,
    )


def shipments(expire_at: float, retry_at: float | None) -> list[Shipment]:
    """The same jobs as one job's shipment and as a batch loaded open (not formed now)."""
    bucket = Bucket("web/d", ordered=False)
    one = JobShipment.of(bucket, job(1, expire_at=expire_at, retry_at=retry_at))
    batch = BatchShipment.form("d", bucket, [job(1, expire_at=expire_at), job(2)], NOW)
    batch.formed, batch.retry_at = False, retry_at
    return [one, batch]


@pytest.mark.parametrize(
    ("expire_at", "retry_at", "expired"),
    [
        (NOW + 1, None, False),  # time left
        (NOW, None, True),  # its time is up
        (NOW - 5, NOW - 10, True),  # a retry before the expiry, taken after it
        (NOW - 5, NOW - 5, False),  # a retry set at the expiry: the last try is still made
    ],
)
def test_a_job_and_a_batch_expire_by_one_rule(
    expire_at: float, retry_at: float | None, expired: bool
) -> None:
    assert [shipment.expired(NOW) for shipment in shipments(expire_at, retry_at)] == [
        expired,
        expired,
    ]


def test_a_batch_formed_now_is_not_expired_by_a_member_on_its_last_try() -> None:
    bucket = Bucket("web/d", ordered=False)
    last_try = job(1, expire_at=NOW - 1, retry_at=NOW - 1)
    assert not JobShipment.of(bucket, last_try).expired(NOW)
    assert not BatchShipment.form("d", bucket, [last_try, job(2)], NOW).expired(NOW)


def test_a_batch_row_is_written_with_its_first_step_only() -> None:
    bucket = Bucket("web/d", ordered=False)
    batch = BatchShipment.form("d", bucket, [job(1, attempt=2), job(2)], NOW)
    first, again = Writes(), Writes()
    batch.executing(NOW, first)
    batch.executing(NOW, again)
    assert [b.job_ids for b in first.batches] == [(1, 2)]
    assert [(s.state, s.attempt) for s in first.steps] == [(EXECUTING, 1)]
    assert again.batches == [] and first.transitions == []
    one = Writes()
    JobShipment.of(bucket, job(7, attempt=2)).executing(NOW, one)
    assert one.transitions == [Transition(7, EXECUTING, 3, time=NOW)]


def test_an_ended_batch_writes_each_member_at_its_own_attempt() -> None:
    bucket = Bucket("web/d", ordered=False)
    batch = BatchShipment.form("d", bucket, [job(1, attempt=2), job(2), job(3)], NOW)
    step = Transition(1, DISCARDED, 1, time=NOW, status_code=400, response="no")
    writes = Writes()
    batch.outcome(step, writes)
    assert [(s.batch_id, s.state, s.status_code) for s in writes.steps] == [
        (batch.key, DISCARDED, 400)
    ]
    assert writes.members == [
        Members((1,), DISCARDED, 3, time=NOW, status_code=400, response="no"),
        Members((2, 3), DISCARDED, 1, time=NOW, status_code=400, response="no"),
    ]
    retry = Writes()
    batch.outcome(Transition(1, AWAITING_RETRY, 1, time=NOW, retry_at=NOW + 9), retry)
    assert retry.members == [] and len(retry.steps) == 1


def test_an_expired_shipment_writes_its_ends() -> None:
    bucket = Bucket("web/d", ordered=False)
    alone, batch = Writes(), Writes()
    JobShipment.of(bucket, job(1, attempt=1)).expiry(2, NOW, alone, "not sent in time")
    assert alone.transitions == [Transition(1, EXPIRED, 2, time=NOW, error_type="not sent in time")]
    BatchShipment.form("d", bucket, [job(1), job(2)], NOW).expiry(1, NOW, batch)
    assert [(s.state, s.attempt) for s in batch.steps] == [(EXPIRED, 1)]
    assert batch.members == [Members((1, 2), EXPIRED, 1, time=NOW)]


def test_a_retry_waits_in_the_bucket_as_a_job_or_as_the_whole_batch() -> None:
    bucket = Bucket("web/d", ordered=False)
    step = Transition(1, AWAITING_RETRY, 1, time=NOW, retry_at=NOW + 30)
    JobShipment.of(bucket, job(1)).again(step, NOW)
    assert [(entry[0], entry[2].attempt) for entry in bucket.retries] == [(NOW + 30, 1)]
    batch = BatchShipment.form("d", bucket, [job(2), job(3)], NOW)
    batch.again(step, NOW)
    assert bucket.batches == [(NOW + 30, 2, batch)]
    assert (batch.attempt, batch.retry_at, batch.key) == (1, NOW + 30, batch.batch.id)


def test_keys_bodies_and_content_types() -> None:
    bucket = Bucket("web/d", ordered=False)
    settings = DestinationSettings(name="d", url="http://127.0.0.1:9/")
    one = JobShipment.of(bucket, job(1))
    assert (one.key, one.body(settings), one.content_type(settings)) == (
        "m1",
        b'{"n":1}',
        "application/json",
    )
    batched = settings.model_copy(
        update={"batch": settings.batch.model_copy(update={"format": "ndjson"})}
    )
    batch = BatchShipment.form("d", bucket, [job(1), job(2)], NOW)
    assert batch.key.startswith("batch_")
    assert batch.body(batched) == b'{"n":1}\n{"n":2}\n'
    assert batch.content_type(batched) == "application/x-ndjson"
