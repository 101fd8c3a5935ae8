"""How long to wait before the next try: exponential backoff with full jitter, one pure function.

Every retry loop in the project (a delivery to a destination, a reconnect to a database) asks
:func:`backoff` for its delay, so the policy is written and tested once. It is pure: the random
source is a parameter, so tests can pin it and property tests can explore it.

The delay after the ``attempt``-th failure (``attempt`` counts from 1) is drawn uniformly from
``[minimum, ceiling]`` with ``ceiling = min(maximum, minimum * coefficient ** attempt)``: the jitter
covers the whole range above the floor ("full jitter"), so clients that failed together spread out
instead of retrying in step. A ``Retry-After`` the caller received is a floor: the delay is never
shorter than what the server asked for, and may be longer than ``maximum`` for that reason only.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable

__all__ = ["backoff", "ceiling"]


def ceiling(attempt: int, *, minimum: float, maximum: float, coefficient: float = 2.0) -> float:
    """The longest delay :func:`backoff` may return after the ``attempt``-th failure."""
    _check(attempt, minimum, maximum, coefficient)
    if minimum == 0.0:
        return 0.0
    # Compare logarithms so a huge attempt number cannot overflow a float.
    if math.log(minimum) + attempt * math.log(coefficient) >= math.log(maximum):
        return maximum
    return min(maximum, minimum * coefficient**attempt)


def backoff(
    attempt: int,
    *,
    minimum: float,
    maximum: float,
    coefficient: float = 2.0,
    jitter: Callable[[], float] = _random.random,
    retry_after: float | None = None,
) -> float:
    """Seconds to wait after the ``attempt``-th failed try (``attempt`` >= 1).

    ``jitter`` returns a number in ``[0, 1)`` (``random.random`` by default); ``retry_after`` is the
    server's ``Retry-After`` in seconds, if it sent one, and is honoured as a lower bound.
    """
    top = ceiling(attempt, minimum=minimum, maximum=maximum, coefficient=coefficient)
    share = jitter()
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"jitter() must return a number in [0, 1], got {share!r}")
    delay = minimum + share * (top - minimum)
    if retry_after is not None and retry_after > delay:
        return float(retry_after)
    return delay


def _check(attempt: int, minimum: float, maximum: float, coefficient: float) -> None:
    if attempt < 1:
        raise ValueError(f"attempt counts failures from 1, got {attempt}")
    if not 0.0 <= minimum <= maximum or not math.isfinite(maximum):
        raise ValueError(f"need 0 <= minimum <= maximum < inf, got {minimum} and {maximum}")
    if not coefficient >= 1.0 or not math.isfinite(coefficient):
        raise ValueError(f"coefficient must be a finite number >= 1, got {coefficient}")
