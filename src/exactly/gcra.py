"""GCRA, the generic cell rate algorithm: one rate limit, two ways to apply it (pure functions).

A limit is ``per_second`` requests on average and ``burst`` at once after a quiet spell. GCRA
keeps one number per limited party, its theoretical arrival time (TAT): the time at which it
would be back to an empty bucket (0 for a party never seen). A request at ``now`` conforms when
``now >= tat - (burst - 1) * interval``; taking it moves the TAT to ``max(tat, at) + interval``.
It is a token bucket without the refill arithmetic.

Guarantee (property-tested in ``tests/unit/test_gcra.py``): whatever the arrivals, no window of
length ``w`` holds more than ``burst + w * per_second`` taken requests, and a party that keeps
to its rate is never held back.

* :func:`police` answers a request *now*: take it, or refuse it with the seconds to wait (the
  collector answers 429 with ``Retry-After``; a refusal leaves the TAT unchanged).
* :func:`shape` tells when the next request *may leave* and the TAT after it leaves (the director
  holds a destination's next request until then).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Rate", "conforming_at", "police", "police_cost", "shape"]

_SLACK = 1e-9  # seconds: float rounding must not hold back a party that is on its schedule


@dataclass(frozen=True)
class Rate:
    """``per_second`` requests per second on average, ``burst`` at once (>= 1)."""

    per_second: float
    burst: int = 1

    def __post_init__(self) -> None:
        if not self.per_second > 0 or not math.isfinite(self.per_second) or self.burst < 1:
            raise ValueError(
                f"a rate needs per_second > 0 and burst >= 1, got {self.per_second} "
                f"and {self.burst}"
            )

    @property
    def interval(self) -> float:
        return 1.0 / self.per_second


def conforming_at(tat: float, rate: Rate) -> float:
    """The earliest time at which a request conforms, for a party whose TAT is ``tat``."""
    return tat - (rate.burst - 1) * rate.interval


def _taken(tat: float, at: float, rate: Rate) -> float:
    """The TAT after a request is taken at ``at``."""
    return max(tat, at) + rate.interval


def police(tat: float, now: float, rate: Rate) -> tuple[float, float]:
    """A request arriving at ``now``: ``(new_tat, 0.0)`` if it is taken, else ``(tat, wait)``
    with the unchanged TAT and the seconds after which the same request would be taken."""
    wait = conforming_at(tat, rate) - now
    if wait > _SLACK:
        return tat, wait
    return _taken(tat, now, rate), 0.0


def police_cost(tat: float, now: float, rate: Rate, cost: float) -> tuple[float, float]:
    """:func:`police` for a request that costs ``cost`` units (bytes, say) rather than one:
    taken when the party's backlog after it is at most ``burst`` units, or, for a request larger
    than ``burst``, when the backlog is empty; ``(new_tat, 0.0)`` or ``(tat, wait)``."""
    start = max(tat, now)
    wait = tat - now if cost > rate.burst else start + (cost - rate.burst) * rate.interval - now
    if wait > _SLACK:
        return tat, wait
    return start + cost * rate.interval, 0.0


def shape(tat: float, now: float, rate: Rate) -> tuple[float, float]:
    """The next request of a party, ready at ``now``: ``(send_at, new_tat)``, the time it may
    leave (``now`` or later) and the TAT once it has left then."""
    earliest = conforming_at(tat, rate)
    send_at = now if earliest - now <= _SLACK else earliest
    return send_at, _taken(tat, send_at, rate)
