"""What to do with an answer, and when the next request may leave: pure functions.

* :func:`outcome`: 2xx succeeded; 408, 429, 5xx, timeouts and connection errors (any request that
  got no answer) retried; any other status discarded, redirects (3xx) included: the receiver
  refused this event or moved, and sending the same request again cannot help (a redirect is
  never followed, so a moved endpoint shows as discarded jobs, to replay once the URL is fixed).
* :func:`retry_after`: a ``Retry-After`` header (seconds or an HTTP date) in seconds from now.
* :func:`next_step`: the transition that records an attempt's outcome, with its retry time from
  :func:`exactly.backoff.backoff` (never before a ``Retry-After``). A job is tried until its
  expiry (``retry.window`` after it was created) or ``retry.max_attempts`` tries: a retry that
  would fall past the expiry is made at the expiry instead, the job's last try, so a long
  ``Retry-After`` or backoff never ends a job early.
"""

from __future__ import annotations

import email.utils
from collections.abc import Callable

from exactly.backoff import backoff
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXPIRED,
    MAX_RESPONSE,
    SUCCEEDED,
    Transition,
)

RETRIED_STATUSES = frozenset({408, 429})


def outcome(status: int | None) -> str:
    """``succeeded``, ``awaiting-retry`` or ``discarded`` for an HTTP status (None: no answer)."""
    if status is None or status in RETRIED_STATUSES or status >= 500:
        return AWAITING_RETRY
    if 200 <= status < 300:
        return SUCCEEDED
    return DISCARDED


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait that a ``Retry-After`` header asks for; None if absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)


def next_step(
    *,
    job_id: int,
    attempt: int,
    expire_at: float,
    now: float,
    status: int | None,
    error_type: str | None = None,
    response: str | None = None,
    retry_after_seconds: float | None = None,
    max_attempts: int | None = None,
    minimum: float,
    maximum: float,
    coefficient: float,
    jitter: Callable[[], float] | None = None,
) -> Transition:
    """The transition that ends attempt number ``attempt`` (counted from 1) of a job."""
    state = outcome(status)
    kept = None if response is None else response[:MAX_RESPONSE]
    retry_at = None
    if state == AWAITING_RETRY:
        options = {} if jitter is None else {"jitter": jitter}
        delay = backoff(
            attempt,
            minimum=minimum,
            maximum=maximum,
            coefficient=coefficient,
            retry_after=retry_after_seconds,
            **options,
        )
        retry_at = min(now + delay, expire_at)
        if now >= expire_at or (max_attempts is not None and attempt >= max_attempts):
            state, retry_at = EXPIRED, None
    if state == SUCCEEDED:
        kept = None
    return Transition(
        job_id,
        state,
        attempt,
        time=now,
        retry_at=retry_at,
        status_code=status,
        error_type=error_type,
        response=kept,
    )
