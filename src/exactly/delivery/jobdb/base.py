"""The JobDB: the jobs waiting to be delivered and every attempt at delivering them.

Centrifuge's layout (seed 004, DESIGN.md "Delivery"): a job is immutable once added (its bucket =
source × destination, the destination's name, payload, message id, user id, created and expire
times); what happens to it is an append-only list of *transitions* (time, attempt, state, retry
time, status code, error type, truncated response). A job's state is its latest transition's, or
``awaiting-scheduling`` when it has none::

    awaiting-scheduling -> executing -> succeeded | discarded | awaiting-retry | expired
    awaiting-retry -> executing -> ...
    succeeded | discarded | expired -> archiving -> archived

Jobs live in numbered *datasets*, each a ``jobs_N`` and a ``job_state_transitions_N`` table. A new
dataset opens after ``dataset_rows`` jobs or ``dataset_minutes``; a closed dataset whose jobs are
all terminal is archived and then removed with ``DROP TABLE``, never row by row, so the JobDB stays
as small as its live jobs whatever it has delivered.

Guarantees, on every backend:

* **A micro-batch's jobs are added once.** :meth:`JobDB.add` writes the jobs and the (query id,
  batch id) marker in one transaction; a batch id not above the marker adds nothing, so a replayed
  micro-batch never doubles a delivery.
* **The JobDB knows where routing stopped.** The marker keeps the batch's stream (what the router
  reads, such as a topic and checkpoint) and its end offsets; :meth:`JobDB.end_offsets` gives the
  newest, so a router whose checkpoint was lost resumes there instead of routing again.
* **Durable on return.** :meth:`JobDB.add` and :meth:`JobDB.record` return after commit (SQLite
  with ``synchronous=FULL``; PostgreSQL and MariaDB with their default durable commit).
* **No credentials at rest.** A job names its destination and never holds its URL or headers:
  the director resolves them from the current settings when it sends, so nothing a destination
  is configured with reaches the JobDB or the archive.
* **One director per partition.** Buckets are spread over partitions
  (:func:`exactly.delivery.partitions.partition_of`); only the holder of a partition's lease
  (:meth:`JobDB.take_partition`) records its buckets' transitions. A lease is released by the
  database or the kernel when its holder dies, however it dies, and on PostgreSQL and MariaDB
  it lives on the connection that writes, so a write that commits was made under the lease.

Who calls what: one JobDB, the SQL in the ``sql`` package over each backend's connection, dialect
and locks (:class:`~exactly.delivery.jobdb.JobDB`), seen by each user through the narrow face of
its role in ``faces.py``: the **router** (``route.py``) adds jobs with their marker; ``exactly
replay`` reads finished jobs and enqueues them again; the **director** (``director/``) holds its
partitions, pages jobs in, records transitions and, as upkeep, archives and drops datasets; the
**operators' commands** pause, resume and expire a destination; the **readers** (``exactly
deliveries``, ``status``, ``trace``, the console) count and look up jobs beside them. This module
holds what they share: the states, the data types and what a control means.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from exactly.delivery import packs

HELD = "one director runs per JobDB: stop the other one first, or wait for it to stop"
PARTITIONS_HELD = (
    "every partition is held by a running director: raise [delivery] partitions to run more "
    "directors, or let this one wait (a standby) without --no-wait"
)
STALE = 5.0  # seconds: a director whose heartbeat is older is not counted as live
RUNNING = "wait for it to finish, then run it again"
AWAITING_SCHEDULING = "awaiting-scheduling"
EXECUTING = "executing"
SUCCEEDED = "succeeded"
DISCARDED = "discarded"
AWAITING_RETRY = "awaiting-retry"
EXPIRED = "expired"
FAILED = "failed"  # the destination's transform failed on the event: never sent, never replayed
ARCHIVING = "archiving"
ARCHIVED = "archived"
PENDING = (AWAITING_SCHEDULING, EXECUTING, AWAITING_RETRY)
TERMINAL = (SUCCEEDED, DISCARDED, EXPIRED, FAILED)
STATES = (*PENDING, *TERMINAL, ARCHIVING, ARCHIVED)
MAX_RESPONSE = 1024  # characters of a response body kept with a transition


def bucket_of(source: str, destination: str, lane: int = 0) -> str:
    """The queue a job waits in: one per source × destination × lane, ``source/destination``
    for lane 0 and ``source/lane/destination`` for the others (names cannot contain '/'), so
    the first part is always the source and the last the destination."""
    if lane:
        return f"{source}/{lane}/{destination}"
    return f"{source}/{destination}"


def lane_of(user_id: str | None, lanes: int) -> int:
    """The lane of a user's jobs among ``lanes``: CRC-32 of the user id (an event's userId,
    else its anonymousId), stable across processes, so a user's jobs share one bucket and an
    ordered destination keeps their order. Jobs without a user are in lane 0."""
    if lanes <= 1 or not user_id:
        return 0
    return zlib.crc32(user_id.encode("utf-8", "surrogatepass")) % lanes


def split_bucket(bucket: str) -> tuple[str, int]:
    """``bucket`` as its lane-0 name and its lane: ``("src/dest", 3)`` for ``src/3/dest``
    (any other name is lane 0 of itself)."""
    source, _, rest = bucket.partition("/")
    lane, slash, destination = rest.partition("/")
    if not slash or not (lane.isascii() and lane.isdigit()):
        return bucket, 0
    return f"{source}/{destination}", int(lane)


# NewJob, Job and Transition are made by the thousand a second (a micro-batch's jobs, a page of
# jobs, a request's steps): not frozen, as a frozen dataclass's __init__ sets each field through
# object.__setattr__, several times the cost; never changed all the same (dataclasses.replace
# makes a changed copy), and hashable by their fields as a frozen one is.
@dataclass(slots=True, unsafe_hash=True)
class NewJob:
    """A job to add: one event for one destination."""

    source: str
    destination: str
    payload: bytes
    message_id: str
    user_id: str | None = None
    expire_at: float = 0.0  # seconds since the epoch; 0 means created + 4 h
    error: str | None = None  # the transform failed: the job is added as failed, with this
    lane: int = 0  # its bucket among the destination's lanes (lane_of its user)

    @property
    def bucket(self) -> str:
        return bucket_of(self.source, self.destination, self.lane)

    @property
    def events(self) -> int:
        """The events it carries: a pack's members (:mod:`exactly.delivery.packs`), else 1."""
        return packs.count(self.payload)


@dataclass(frozen=True)
class RouteCounts:
    """Events routing chose not to send to one destination, by why (``exactly deliveries``)."""

    filtered: int = 0  # its filter (or its sources and events) was not true
    skipped: int = 0  # the event's integrations object left it out
    dropped: int = 0  # its transform returned None

    def __add__(self, other: RouteCounts) -> RouteCounts:
        return RouteCounts(
            self.filtered + other.filtered,
            self.skipped + other.skipped,
            self.dropped + other.dropped,
        )

    def __bool__(self) -> bool:
        return bool(self.filtered or self.skipped or self.dropped)


ROUTE, BACKFILL = "route", "backfill"  # the kinds of spans, and the origins of counts


@dataclass(frozen=True)
class Span:
    """Offsets of a topic whose events were routed to one destination: what backfill skips.

    The live route opens a ``route`` span for a destination when it starts routing with it
    (from where its stream's routing had got to) and closes it when it starts without it. A
    backfill run keeps one ``backfill`` span, extended with each chunk it commits, that holds
    only the events whose ``receivedAt`` lies in its window. A partition missing from ``start``
    starts at offset 0; one missing from ``end`` holds nothing; ``end`` None is open.
    """

    destination: str
    topic: str
    kind: str  # ROUTE or BACKFILL
    owner: str  # the route query's stream, or the backfill's run
    start: Mapping[int, int]
    end: Mapping[int, int] | None = None
    since_ms: int | None = None  # receivedAt window, backfill only; None: unbounded
    until_ms: int | None = None

    def begins(self, partition: int) -> int:
        return self.start.get(partition, 0)

    def ends(self, partition: int) -> int | None:
        """Where the span ends in ``partition`` (None: open)."""
        if self.end is None:
            return None
        return self.end.get(partition, self.begins(partition))

    def within(self, since_ms: int | None, until_ms: int | None) -> bool:
        """Whether every event of the window [since, until) is in this span's window."""
        low = self.since_ms is None or (since_ms is not None and since_ms >= self.since_ms)
        high = self.until_ms is None or (until_ms is not None and until_ms <= self.until_ms)
        return low and high

    def holds(self, partition: int, offset: int, received_ms: int | None) -> bool:
        """Whether the event at ``offset`` of ``partition``, received then, is routed here."""
        end = self.ends(partition)
        if offset < self.begins(partition) or (end is not None and offset >= end):
            return False
        if self.since_ms is None and self.until_ms is None:
            return True
        if received_ms is None:
            return False
        return (self.since_ms is None or received_ms >= self.since_ms) and (
            self.until_ms is None or received_ms < self.until_ms
        )


@dataclass(slots=True, unsafe_hash=True)
class Job:
    """A stored job with its latest state (``attempt`` counts the tries made so far)."""

    id: int
    bucket: str
    destination: str
    payload: bytes
    message_id: str
    user_id: str | None
    created_at: float
    expire_at: float
    state: str = AWAITING_SCHEDULING
    attempt: int = 0
    retry_at: float | None = None

    @property
    def packed(self) -> bool:
        """Whether it is a batch the route query made (:mod:`exactly.delivery.packs`)."""
        return packs.is_packed(self.payload)

    @property
    def events(self) -> int:
        """The events it carries: a pack's members, else 1."""
        return packs.count(self.payload)


@dataclass(slots=True, unsafe_hash=True)
class Transition:
    """One step of a job's history, appended and never changed."""

    job_id: int
    state: str
    attempt: int
    time: float = 0.0  # 0 means now
    retry_at: float | None = None
    status_code: int | None = None
    error_type: str | None = None
    response: str | None = None


@dataclass(frozen=True, slots=True)
class Members:
    """The same step for each job of ``job_ids`` (a batch's members when it is formed or
    ends): a transition each, as :class:`Transition` would write, but handed over as one, so
    neither side spends Python on a row per job."""

    job_ids: tuple[int, ...]
    state: str
    attempt: int
    time: float = 0.0  # 0 means now
    retry_at: float | None = None
    status_code: int | None = None
    error_type: str | None = None
    response: str | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    """Jobs of one bucket sent in one request, formed once and recorded before its first try.

    Its ``id`` is the request's ``Idempotency-Key`` / ``webhook-id`` on every attempt; its
    ``job_ids`` are its members in the order the body carries them."""

    id: str
    bucket: str
    destination: str
    job_ids: tuple[int, ...]
    created_at: float = 0.0  # 0 means now


@dataclass(frozen=True, slots=True)
class BatchStep:
    """One step of a batch's history (its attempts), appended and never changed."""

    batch_id: str
    state: str
    attempt: int
    time: float = 0.0  # 0 means now
    retry_at: float | None = None
    status_code: int | None = None
    error_type: str | None = None
    response: str | None = None


@dataclass(frozen=True, slots=True)
class OpenBatch:
    """A batch not yet ended (its latest step ``executing`` or ``awaiting-retry``) with its
    member jobs (each in the state it had before the batch; ``executing`` in a JobDB written
    before members got no row of their own while their batch is out)."""

    batch: Batch
    jobs: tuple[Job, ...]
    state: str
    attempt: int
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class Dataset:
    number: int
    first_id: int
    rows: int
    created_at: float

    def holds(self, job_id: int) -> bool:
        return self.first_id <= job_id < self.first_id + self.rows


@dataclass(frozen=True, slots=True)
class Control:
    """What is set for one destination besides its jobs: an operator's pause, an expiry an
    operator asked for (and its result, once the director has applied it), and the breaker's
    state as the director last reported it."""

    destination: str
    held: bool = False
    expire_before: float | None = None  # asked: expire pending jobs created before this
    expire_asked: float | None = None  # when it was asked
    expired: int | None = None  # how many the directors expired for that ask (so far)
    expired_partitions: tuple[int, ...] = ()  # the partitions whose director answered the ask
    failing_since: float | None = None
    breaker_open: bool = False


def sending(control: Control | None) -> str:
    """``yes``, ``paused`` (by an operator) or ``paused (failing since HH:MM:SS UTC)``."""
    if control is None:
        return "yes"
    if control.held:
        return "paused"
    if control.breaker_open and control.failing_since is not None:
        since = datetime.fromtimestamp(control.failing_since, UTC).strftime("%H:%M:%S")
        return f"paused (failing since {since})"
    return "yes"


CONTROL_FIELDS = (
    "held",
    "expire_before",
    "expire_asked",
    "expired",
    "expired_partitions",
    "failing_since",
    "breaker_open",
)


@dataclass(slots=True)
class Summary:
    """One destination's jobs at a glance (``exactly deliveries``)."""

    destination: str
    states: dict[str, int]
    oldest_pending_seconds: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    succeeded_last_minute: int = 0
    sending: str = "yes"  # or "paused", "paused (failing since HH:MM:SS)": :func:`sending`
    withheld: RouteCounts = RouteCounts()  # events routing chose not to send it

    @property
    def queued(self) -> int:
        return self.states.get(AWAITING_SCHEDULING, 0) + self.states.get(EXECUTING, 0)

    @property
    def rate_per_second(self) -> float:
        """Deliveries per second over the last minute."""
        return self.succeeded_last_minute / 60.0
