"""Backoff policy: properties of the one pure function every retry loop uses."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.backoff import backoff, ceiling

attempts = st.integers(min_value=1, max_value=10_000)
minimums = st.floats(min_value=0.0, max_value=3600.0)
spans = st.floats(min_value=0.0, max_value=86_400.0)
coefficients = st.floats(min_value=1.0, max_value=10.0)
shares = st.floats(min_value=0.0, max_value=1.0)


@given(attempts, minimums, spans, coefficients, shares)
def test_delay_stays_between_minimum_and_ceiling(
    attempt: int, minimum: float, span: float, coefficient: float, share: float
) -> None:
    maximum = minimum + span
    delay = backoff(
        attempt, minimum=minimum, maximum=maximum, coefficient=coefficient, jitter=lambda: share
    )
    top = ceiling(attempt, minimum=minimum, maximum=maximum, coefficient=coefficient)
    assert minimum <= delay <= top <= maximum


@given(attempts, minimums, spans, coefficients)
def test_ceiling_grows_with_attempts_up_to_maximum(
    attempt: int, minimum: float, span: float, coefficient: float
) -> None:
    maximum = minimum + span
    kwargs = {"minimum": minimum, "maximum": maximum, "coefficient": coefficient}
    assert ceiling(attempt, **kwargs) <= ceiling(attempt + 1, **kwargs)
    assert ceiling(10_000 * attempt, **kwargs) <= maximum


@given(attempts, shares)
def test_full_jitter_spans_the_whole_range(attempt: int, share: float) -> None:
    low = backoff(attempt, minimum=5, maximum=300, jitter=lambda: 0.0)
    high = backoff(attempt, minimum=5, maximum=300, jitter=lambda: 1.0)
    middle = backoff(attempt, minimum=5, maximum=300, jitter=lambda: share)
    assert low == 5
    assert high == min(300, 5 * 2**attempt)
    assert low <= middle <= high


@given(attempts, shares, st.floats(min_value=0.0, max_value=86_400.0))
def test_retry_after_is_a_floor(attempt: int, share: float, retry_after: float) -> None:
    plain = backoff(attempt, minimum=5, maximum=300, jitter=lambda: share)
    honoured = backoff(
        attempt, minimum=5, maximum=300, jitter=lambda: share, retry_after=retry_after
    )
    assert honoured == max(plain, retry_after)


def test_default_jitter_is_random_and_in_range() -> None:
    delays = {backoff(3, minimum=1, maximum=100) for _ in range(200)}
    assert len(delays) > 100
    assert all(1 <= delay <= 8 for delay in delays)


def test_examples() -> None:
    assert backoff(1, minimum=5, maximum=300, jitter=lambda: 1.0) == 10
    assert backoff(2, minimum=5, maximum=300, jitter=lambda: 0.5) == 12.5
    assert backoff(50, minimum=5, maximum=300, jitter=lambda: 1.0) == 300
    assert backoff(1, minimum=0.2, maximum=5, coefficient=1.0, jitter=lambda: 0.7) == 0.2


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": 0, "minimum": 1, "maximum": 2},
        {"attempt": 1, "minimum": -1, "maximum": 2},
        {"attempt": 1, "minimum": 3, "maximum": 2},
        {"attempt": 1, "minimum": 1, "maximum": float("inf")},
        {"attempt": 1, "minimum": 1, "maximum": 2, "coefficient": 0.5},
        {"attempt": 1, "minimum": 1, "maximum": 2, "jitter": lambda: 2.0},
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        backoff(**kwargs)  # type: ignore[arg-type]
