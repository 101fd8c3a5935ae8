"""What one request carries: one job, or a batch of one bucket's jobs.

Both kinds go the one way of :mod:`.sending`: recorded ``executing`` (step 1), sent under one
key with one body (step 2), their outcome decided by one
:func:`~exactly.delivery.policy.next_step` and recorded (step 3), counted in one tally (a
shipment counts its jobs) and expired by one rule (:meth:`Shipment.expired`). They differ only
in the rows that record them (a job's transitions; a batch's row and steps, with each member's
transition once it ends) and in where a retry waits (a job back in its bucket's queue; a batch,
whole and under its id, in its bucket's batches).
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from exactly.delivery import packs
from exactly.delivery.batches import CONTENT_TYPES, batch_id, body
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    EXECUTING,
    EXPIRED,
    Batch,
    BatchStep,
    Job,
    Members,
    Transition,
)

if TYPE_CHECKING:
    from exactly.delivery.director.writer import Writes
    from exactly.delivery.settings import DestinationSettings


class Origin(Protocol):
    """A bucket as its shipments see it (:class:`.queues.Bucket`, which holds them in turn:
    described here so that the two modules do not import each other)."""

    name: str
    ordered: bool
    taken: int
    users_out: set[str]
    batches: list[tuple[float, int, BatchShipment]]
    extra: int

    def again(self, job: Job) -> None: ...


class Outlet(Protocol):
    """Where a shipment hands back what it took (:class:`.queues.Destination`)."""

    def done(self, bucket: Origin, job: Job) -> None: ...

    def batch_done(self, held: BatchShipment, *, ended: bool) -> None: ...

    def request_ended(self) -> None: ...


@dataclass(eq=False)
class Shipment(ABC):
    """Jobs of ``bucket`` sent in one request, from when they are taken until their attempt
    ends; ``attempt`` counts the tries so far, ``retry_at`` when the next is due."""

    bucket: Origin
    jobs: list[Job]
    attempt: int = 0
    retry_at: float | None = None

    @property
    def expire_at(self) -> float:
        """The earliest member's expiry: the shipment's time is up with it."""
        return min(job.expire_at for job in self.jobs)

    @property
    def created_at(self) -> float:
        return min(job.created_at for job in self.jobs)

    @property
    def events(self) -> int:
        """The events it carries (a pack counts its members)."""
        return sum(job.events for job in self.jobs)

    def expired(self, now: float) -> bool:
        """Whether its time is up before its next try, unless that try was set at the expiry
        (the last try a long ``Retry-After`` or backoff leaves it): it is still made."""
        expire_at = self.expire_at
        if expire_at > now:
            return False
        return not (self.retry_at is not None and self.retry_at >= expire_at)

    @property
    @abstractmethod
    def key(self) -> str:
        """The ``Idempotency-Key`` / ``webhook-id`` of every attempt."""

    @abstractmethod
    def body(self, settings: DestinationSettings) -> bytes:
        """The request body, built when the request leaves."""

    @abstractmethod
    def content_type(self, settings: DestinationSettings) -> str: ...

    @abstractmethod
    def executing(self, now: float, writes: Writes) -> None:
        """Step 1: the rows that record its next attempt ``executing``."""

    @abstractmethod
    def expiry(
        self, attempt: int, now: float, writes: Writes, error_type: str | None = None
    ) -> None:
        """The rows that end it ``expired`` after ``attempt`` tries."""

    @abstractmethod
    def outcome(self, step: Transition, writes: Writes) -> None:
        """Step 3: the rows that record its attempt's outcome, ``step`` (from ``next_step``)."""

    @abstractmethod
    def again(self, step: Transition, now: float) -> None:
        """Wait in its bucket for the retry ``step`` sets."""

    @abstractmethod
    def release(self, destination: Outlet, *, ended: bool) -> None:
        """Its attempt is over (recorded, or the recording failed); with ``ended``, the
        shipment too, and its jobs no longer count as taken."""


@dataclass(eq=False)
class JobShipment(Shipment):
    """One job, sent under its message id with its payload as the body."""

    @classmethod
    def of(cls, bucket: Origin, job: Job) -> JobShipment:
        return cls(bucket, [job], job.attempt, job.retry_at)

    @property
    def job(self) -> Job:
        return self.jobs[0]

    @property
    def expire_at(self) -> float:
        return self.jobs[0].expire_at

    @property
    def key(self) -> str:
        return self.job.message_id

    def body(self, settings: DestinationSettings) -> bytes:
        return self.job.payload

    def content_type(self, settings: DestinationSettings) -> str:
        return "application/json"

    def executing(self, now: float, writes: Writes) -> None:
        writes.transitions.append(Transition(self.job.id, EXECUTING, self.attempt + 1, time=now))

    def expiry(
        self, attempt: int, now: float, writes: Writes, error_type: str | None = None
    ) -> None:
        writes.transitions.append(
            Transition(self.job.id, EXPIRED, attempt, time=now, error_type=error_type)
        )

    def outcome(self, step: Transition, writes: Writes) -> None:
        writes.transitions.append(step)

    def again(self, step: Transition, now: float) -> None:
        self.bucket.again(
            dataclasses.replace(
                self.job, state=AWAITING_RETRY, attempt=step.attempt, retry_at=step.retry_at
            )
        )

    def release(self, destination: Outlet, *, ended: bool) -> None:
        # a job to retry waits in its bucket as a job again: its taking always ends here
        destination.done(self.bucket, self.job)


@dataclass(eq=False)
class PackShipment(JobShipment):
    """A batch the route query made (:mod:`exactly.delivery.packs`): one job, sent as a batch,
    under its key, with a body of its members in the destination's batch format; as a job
    otherwise (its transitions, its retries back in its bucket). ``counted``: taken as one of
    a batching destination's batches out, freed when its attempt ends."""

    counted: bool = field(default=False, kw_only=True)

    def body(self, settings: DestinationSettings) -> bytes:
        form = settings.batch.format
        if form == "json-array":
            return b"[" + packs.joined(self.job.payload) + b"]"
        return body(form, packs.payloads(self.job.payload), time.time())  # this sentAt

    def content_type(self, settings: DestinationSettings) -> str:
        return CONTENT_TYPES[settings.batch.format]

    def release(self, destination: Outlet, *, ended: bool) -> None:
        if self.counted:
            self.counted = False
            destination.request_ended()
        if ended:  # no longer held by its bucket (a retry waits there again)
            self.bucket.extra -= self.job.events - 1
        destination.done(self.bucket, self.job)


def shipment_of(bucket: Origin, job: Job, *, counted: bool = False) -> JobShipment:
    """A job's shipment: a pack's (``counted`` among a batching destination's batches out), or
    a job's alone."""
    if job.packed:
        return PackShipment(bucket, [job], job.attempt, job.retry_at, counted=counted)
    return JobShipment.of(bucket, job)


@dataclass(eq=False)
class BatchShipment(Shipment):
    """A batch, formed once and recorded before its first attempt (its row lists its members,
    who get no row of their own until it ends), sent under its id with a body rebuilt from its
    members in their order; its members each hold the attempts they had before it."""

    batch: Batch = field(kw_only=True)
    formed: bool = field(default=False, kw_only=True)  # formed now: its row not yet written

    @classmethod
    def form(cls, destination: str, bucket: Origin, jobs: list[Job], now: float) -> BatchShipment:
        """A new batch of ``jobs``, its id derived from its destination and members."""
        members = tuple(job.id for job in jobs)
        key = batch_id(destination, [(job.id, job.message_id) for job in jobs])
        batch = Batch(key, bucket.name, destination, members, created_at=now)
        return cls(bucket, jobs, batch=batch, formed=True)

    @property
    def id(self) -> str:
        return self.batch.id

    @property
    def key(self) -> str:
        return self.batch.id

    def expired(self, now: float) -> bool:
        # a batch formed now holds only members whose time is not up (each checked as a job)
        return not self.formed and super().expired(now)

    def body(self, settings: DestinationSettings) -> bytes:
        form = settings.batch.format
        return body(form, [job.payload for job in self.jobs], time.time())  # this sentAt

    def content_type(self, settings: DestinationSettings) -> str:
        return CONTENT_TYPES[settings.batch.format]

    def executing(self, now: float, writes: Writes) -> None:
        if self.formed:
            writes.batches.append(self.batch)
            self.formed = False
        writes.steps.append(BatchStep(self.id, EXECUTING, self.attempt + 1, time=now))

    def expiry(
        self, attempt: int, now: float, writes: Writes, error_type: str | None = None
    ) -> None:
        writes.steps.append(BatchStep(self.id, EXPIRED, attempt, time=now, error_type=error_type))
        writes.members += _members(self.jobs, EXPIRED, max(attempt, 1), now)

    def outcome(self, step: Transition, writes: Writes) -> None:
        writes.steps.append(
            BatchStep(
                self.id,
                step.state,
                step.attempt,
                time=step.time,
                retry_at=step.retry_at,
                status_code=step.status_code,
                error_type=step.error_type,
                response=step.response,
            )
        )
        if step.state != AWAITING_RETRY:  # the batch ends: each member's transition with it
            writes.members += _members(
                self.jobs,
                step.state,
                max(step.attempt, 1),
                step.time,
                status_code=step.status_code,
                error_type=step.error_type,
                response=step.response,
            )

    def again(self, step: Transition, now: float) -> None:
        self.attempt, self.retry_at = step.attempt, step.retry_at
        heapq.heappush(self.bucket.batches, (step.retry_at or now, self.jobs[0].id, self))

    def release(self, destination: Outlet, *, ended: bool) -> None:
        destination.batch_done(self, ended=ended)


def _members(jobs: list[Job], state: str, tries: int, now: float, **outcome: Any) -> list[Members]:
    """``state`` for each of ``jobs`` at its own attempt (the tries it had before the batch,
    plus ``tries`` of the batch), as one :class:`Members` per attempt number: usually one for
    a whole batch."""
    by_attempt: dict[int, list[int]] = {}
    for job in jobs:
        by_attempt.setdefault(job.attempt, []).append(job.id)
    return [
        Members(tuple(ids), state, before + tries, time=now, **outcome)
        for before, ids in by_attempt.items()
    ]
