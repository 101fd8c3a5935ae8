"""Delivery policy: outcomes, Retry-After, the next transition and signatures."""

from __future__ import annotations

import email.utils

from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from exactly.delivery.jobdb.base import AWAITING_RETRY, DISCARDED, EXPIRED, SUCCEEDED
from exactly.delivery.policy import next_step, outcome, retry_after
from exactly.delivery.settings import signing_key
from exactly.delivery.signing import request_headers

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@given(st.integers(min_value=100, max_value=599))
def test_outcome_of_every_status(status: int) -> None:
    if 200 <= status < 300:
        assert outcome(status) == SUCCEEDED
    elif status >= 500 or status in (408, 429):
        assert outcome(status) == AWAITING_RETRY
    else:
        assert outcome(status) == DISCARDED
    assert outcome(None) == AWAITING_RETRY


def test_retry_after_seconds_or_date() -> None:
    assert retry_after("120", 0.0) == 120.0
    assert retry_after(None, 0.0) is None
    assert retry_after("soon", 0.0) is None
    when = email.utils.formatdate(1_000_060, usegmt=True)
    assert retry_after(when, 1_000_000.0) == 60.0
    assert retry_after(when, 2_000_000.0) == 0.0


@given(
    st.integers(min_value=1, max_value=50),
    st.floats(min_value=0, max_value=1),
    st.none() | st.floats(min_value=0, max_value=1000),
)
def test_next_step_retries_within_expiry(attempt: int, share: float, wait: float | None) -> None:
    common = {
        "job_id": 1,
        "attempt": attempt,
        "now": 1000.0,
        "status": 503,
        "retry_after_seconds": wait,
        "minimum": 5.0,
        "maximum": 300.0,
        "coefficient": 2.0,
        "jitter": lambda: share,
    }
    far = next_step(expire_at=10**9, **common)  # type: ignore[arg-type]
    assert far.state == AWAITING_RETRY and far.retry_at is not None
    assert far.retry_at >= 1005.0 and (wait is None or far.retry_at >= 1000.0 + wait)
    # a retry that would fall past the expiry is made at the expiry: the job's last try
    near = next_step(expire_at=far.retry_at - 0.001, **common)  # type: ignore[arg-type]
    assert near.state == AWAITING_RETRY and near.retry_at == far.retry_at - 0.001
    last = next_step(expire_at=1000.0, **common)  # type: ignore[arg-type]
    assert last.state == EXPIRED and last.retry_at is None


def test_a_long_retry_after_keeps_the_job_until_its_expiry() -> None:
    """Retry-After: 86400 with a 4 h expiry: tried once more at the expiry, then expired."""
    common = {"job_id": 1, "status": 429, "minimum": 5.0, "maximum": 300.0, "coefficient": 2.0}
    first = next_step(
        attempt=1, now=0.0, expire_at=4 * 3600.0, retry_after_seconds=86400.0, **common
    )  # type: ignore[arg-type]
    assert (first.state, first.retry_at) == (AWAITING_RETRY, 4 * 3600.0)
    last = next_step(attempt=2, now=4 * 3600.0, expire_at=4 * 3600.0, **common)  # type: ignore[arg-type]
    assert last.state == EXPIRED


def test_max_attempts_ends_a_failing_job() -> None:
    common = {"job_id": 1, "status": 503, "minimum": 5.0, "maximum": 300.0, "coefficient": 2.0}
    second = next_step(attempt=2, now=0.0, expire_at=10**9, max_attempts=3, **common)  # type: ignore[arg-type]
    third = next_step(attempt=3, now=0.0, expire_at=10**9, max_attempts=3, **common)  # type: ignore[arg-type]
    assert (second.state, third.state) == (AWAITING_RETRY, EXPIRED)


def test_a_redirect_is_discarded_not_followed() -> None:
    """3xx: the rule stated in policy.py; a moved endpoint shows as discarded, to replay."""
    for status in (301, 302, 307, 308):
        step = next_step(
            job_id=1,
            attempt=1,
            now=0.0,
            expire_at=10**9,
            status=status,
            minimum=5.0,
            maximum=300.0,
            coefficient=2.0,
        )
        assert step.state == DISCARDED


def test_next_step_keeps_a_refusal_truncated() -> None:
    step = next_step(
        job_id=3,
        attempt=1,
        expire_at=10**9,
        now=5.0,
        status=404,
        response="n" * 5000,
        minimum=5,
        maximum=300,
        coefficient=2,
    )
    assert (step.state, step.status_code, len(step.response or "")) == (DISCARDED, 404, 1024)


def test_signature_verifies_with_standard_webhooks() -> None:
    body = b'{"messageId":"m1","event":"Order Completed"}'
    import time

    now = int(time.time())
    headers = request_headers(
        message_id="m1", body=body, timestamp=now, keys=[signing_key(SECRET)], extra={"X-A": "b"}
    )
    assert Webhook(SECRET).verify(body, headers)["messageId"] == "m1"
    assert headers["Idempotency-Key"] == headers["webhook-id"] == "m1"
    assert headers["X-A"] == "b"
    unsigned = request_headers(message_id="m1", body=body, timestamp=now, keys=(), extra={})
    assert "webhook-signature" not in unsigned
