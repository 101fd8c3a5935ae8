"""When a destination's next request may leave: one pure object per destination.

A destination is one receiver, so everything about its capacity is shared by its buckets (one per
source): the configured ``rate`` and ``burst`` (GCRA, :mod:`exactly.gcra`), a pause the receiver
asked for, a rate backed off after throttling, and a breaker after consecutive failures. The
director asks :meth:`Pace.take` before each request and tells :meth:`Pace.answered` every outcome.

* **Throttled** (429, or 503 with ``Retry-After``): the whole destination pauses until the time
  asked for (``Retry-After``, else the backoff's minimum), stretched by a random 0-20% so that
  directors and buckets do not come back in step; and its rate is halved (from the rate it was
  sending at), once per pause however many requests were out, then doubles with each second of
  successful answers until it is past the configured rate, or four times the rate at which it
  was throttled when none is configured (a multiplicative decrease, as in TCP's congestion
  control, and a regrowth like its slow start).
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from exactly.backoff import backoff
from exactly.gcra import Rate, shape

SUCCESS, REFUSED, FAILED, THROTTLED = "success", "refused", "failed", "throttled"
PAUSE_JITTER = 0.2  # a pause is stretched by up to this share, drawn at random
DECREASE = 0.5  # the throttled rate is this share of the rate sent at
GROWTH = 2.0  # a throttled rate grows by this factor per second of successes
RECOVERED = 4.0  # with no configured rate, the throttle ends at this many times where it began
FLOOR = 0.1  # requests per second: the slowest a throttled destination is held to
WINDOW = 5.0  # seconds of sends over which the sending rate is measured


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
    throttle: float | None = None  # requests per second while backing off from a 429
    throttled_at: float = 0.0  # the rate sent at when the throttle began
    grown_at: float = 0.0  # when the throttle last grew
    failures: int = 0  # consecutive
    failing_since: float | None = None
    probe_at: float | None = None  # the breaker is open while this is set
    probes: int = 0
    probing: bool = False
    held: bool = False  # paused by an operator
    _sent: deque[float] = field(default_factory=deque)

    @property
    def open(self) -> bool:
        """Whether the breaker is open (only probes leave)."""
        return self.probe_at is not None

    def limit(self) -> float | None:
        """The requests per second allowed now: the configured rate or the throttle, lower."""
        if self.throttle is None:
            return self.rate
        return self.throttle if self.rate is None else min(self.rate, self.throttle)

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
        limit = self.limit()
        if limit is not None:
            send_at, tat = shape(self.tat, now, Rate(limit, self.burst))
            if send_at > now:
                if self.probing and self.probe_at is not None:
                    self.probing = False
                return send_at - now
            self.tat = tat
        self._sent.append(now)
        while self._sent and self._sent[0] < now - WINDOW:
            self._sent.popleft()
        return 0.0

    def sending_rate(self, now: float) -> float:
        """Requests per second over the last :data:`WINDOW` seconds (or since the first request
        of a burst, counted as at least a second)."""
        while self._sent and self._sent[0] < now - WINDOW:
            self._sent.popleft()
        if not self._sent:
            return 0.0
        return len(self._sent) / max(now - self._sent[0], 1.0)

    def answered(self, result: str, now: float, *, wait: float | None = None) -> None:
        """Take one request's outcome into account (``wait``: its Retry-After in seconds)."""
        self.probing = False
        if result == THROTTLED:
            self._throttled(now, wait)
        elif result == FAILED:
            self._failed(now)
        else:
            self._answered(result, now)

    def _throttled(self, now: float, wait: float | None) -> None:
        pause = self.probe_minimum if wait is None else wait
        episode = now < self.paused_until  # the answers of requests already out: one decrease
        self.paused_until = max(self.paused_until, now + pause * (1 + PAUSE_JITTER * self.jitter()))
        if episode:
            return
        sending = self.throttle if self.throttle is not None else self.sending_rate(now)
        if self.throttle is None:
            self.throttled_at = max(sending, FLOOR)
        self.throttle = max(FLOOR, DECREASE * max(sending, FLOOR))
        self.grown_at = self.paused_until

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

    def _answered(self, result: str, now: float) -> None:
        self.failures, self.failing_since = 0, None
        self.probe_at, self.probes = None, 0
        if result != SUCCESS or self.throttle is None or now < self.paused_until:
            return
        self.throttle *= GROWTH ** min(max(now - self.grown_at, 0.0), 10.0)
        self.grown_at = now
        ceiling = self.rate if self.rate is not None else RECOVERED * self.throttled_at
        if self.throttle >= ceiling:
            self.throttle = None


def result_of(status: int | None, *, retry_after: float | None) -> str:
    """How an answer counts for pacing: a status (None: no answer) and its Retry-After."""
    if status == 429 or (status == 503 and retry_after is not None):
        return THROTTLED
    if status is None or status == 408 or status >= 500:
        return FAILED
    if 200 <= status < 300:
        return SUCCESS
    return REFUSED
