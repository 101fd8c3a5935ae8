"""When a destination's next request may leave: one pure object per destination.

A destination is one receiver, so everything about its capacity is shared by its buckets (one per
source): the configured ``rate`` and ``burst`` (GCRA, :mod:`exactly.gcra`), a pause the receiver
asked for, a window of requests out narrowed after throttling, and a breaker after consecutive
failures. The director asks :meth:`Pace.take` before each request and :meth:`Pace.allowed` how
many may be out, and tells :meth:`Pace.answered` every outcome.

* **Throttled** (429, or 503 with ``Retry-After``): the request that got it waits what it asked
  for (``Retry-After``, else the backoff's minimum; :func:`~exactly.delivery.policy.next_step`),
  and the destination's window of requests out (at most ``max_in_flight``) narrows by half a
  request; each success widens it by one request per window of successes, back to
  ``max_in_flight``. So the window settles where the receiver throttles about one request in
  ``1 + window / 2``: a receiver throttling 5% of the requests keeps the whole window (the
  throttled ones come back after their wait), one throttling half of them holds it near two,
  and one throttling everything narrows it to one within twice ``max_in_flight`` requests.
  Only then does a 429 pause the whole destination, for the time asked, stretched by a random
  0-20% so that directors and buckets do not come back in step: a receiver that throttles
  everything sees one request per pause.
* **Failing** (no answer, a connection error, 5xx, 408): after ``open_after`` consecutive
  failures spanning at least ``failing_for`` seconds the breaker opens (the span keeps a receiver
  that fails each first try and takes the retries from being taken for down: new jobs' first
  tries come in runs, the successful retries seconds later). Then one request at a time is a
  probe, the next after a growing delay (the destination's backoff); the first success closes
  the breaker. A refused request (another 4xx) is an answer, so it closes the breaker too.
* **Paused by an operator** (``exactly deliveries pause``): nothing leaves until resumed.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from exactly.backoff import backoff
from exactly.gcra import Rate, shape

SUCCESS, REFUSED, FAILED, THROTTLED = "success", "refused", "failed", "throttled"
PAUSE_JITTER = 0.2  # a pause is stretched by up to this share, drawn at random
NARROWING = 0.5  # requests the window loses per 429


@dataclass
class Pace:
    """One destination's pacing state; every time is seconds since the epoch."""

    rate: float | None = None
    burst: int = 1
    open_after: int | None = None
    failing_for: float = 0.0
    probe_minimum: float = 5.0
    probe_maximum: float = 300.0
    jitter: Callable[[], float] = random.random
    tat: float = 0.0
    paused_until: float = 0.0
    window: float | None = None  # requests allowed out after a 429; None: max_in_flight
    failures: int = 0  # consecutive
    failing_since: float | None = None
    probe_at: float | None = None  # the breaker is open while this is set
    probes: int = 0
    probing: bool = False
    held: bool = False  # paused by an operator

    @property
    def open(self) -> bool:
        """Whether the breaker is open (only probes leave)."""
        return self.probe_at is not None

    def allowed(self, maximum: int) -> int:
        """The requests that may be out at once, of ``maximum`` (``max_in_flight``)."""
        if self.window is None:
            return maximum
        return max(1, min(maximum, int(self.window)))

    def take(self, now: float) -> float:
        """0 if a request may leave now (and it is counted as leaving), else seconds to wait."""
        if self.held:
            return 1.0
        if now < self.paused_until:
            return self.paused_until - now
        if self.probe_at is not None:
            if self.probing:
                return 1.0  # the probe's answer decides; it wakes the senders
            if now < self.probe_at:
                return self.probe_at - now
            self.probing = True
        if self.rate is not None:
            send_at, tat = shape(self.tat, now, Rate(self.rate, self.burst))
            if send_at > now:
                if self.probing and self.probe_at is not None:
                    self.probing = False
                return send_at - now
            self.tat = tat
        return 0.0

    def answered(self, result: str, now: float, *, maximum: int, wait: float | None = None) -> None:
        """Take one request's outcome into account: ``wait``, its Retry-After in seconds;
        ``maximum``, the destination's ``max_in_flight`` (this director's share of it)."""
        self.probing = False
        if result == THROTTLED:
            self._throttled(now, wait, maximum)
        elif result == FAILED:
            self._failed(now)
        else:
            self._answered(result, now, maximum)

    def _throttled(self, now: float, wait: float | None, maximum: int) -> None:
        current = self.window if self.window is not None else float(maximum)
        if current <= 1:  # one request at a time, throttled still: the destination waits
            pause = self.probe_minimum if wait is None else wait
            until = now + pause * (1 + PAUSE_JITTER * self.jitter())
            self.paused_until = max(self.paused_until, until)
        self.window = max(1.0, min(current, maximum) - NARROWING)

    def _failed(self, now: float) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = now
        if self.open_after is None or self.failures < self.open_after:
            return
        if now - self.failing_since < self.failing_for:
            return
        self.probes += 1
        delay = backoff(
            self.probes, minimum=self.probe_minimum, maximum=self.probe_maximum, jitter=self.jitter
        )
        self.probe_at = now + delay

    def _answered(self, result: str, now: float, maximum: int) -> None:
        self.failures, self.failing_since = 0, None
        self.probe_at, self.probes = None, 0
        if result != SUCCESS or self.window is None:
            return
        self.window += 1.0 / self.window  # one request more per window of successes
        if self.window >= maximum:
            self.window = None


def result_of(status: int | None, *, retry_after: float | None) -> str:
    """How an answer counts for pacing: a status (None: no answer) and its Retry-After."""
    if status == 429 or (status == 503 and retry_after is not None):
        return THROTTLED
    if status is None or status == 408 or status >= 500:
        return FAILED
    if 200 <= status < 300:
        return SUCCESS
    return REFUSED
