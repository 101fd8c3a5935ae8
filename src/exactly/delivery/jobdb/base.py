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

Who calls what (:class:`JobDB` groups its methods so): the **router** (``route.py``, and replay
enqueuing) adds jobs with their marker; the **director** (``director/``) holds the lock, pages
jobs in, records transitions and, as upkeep, archives and drops datasets; the **readers**
(``exactly deliveries``, ``trace``, ``replay``, the console) count and look up jobs beside it. A
backend must implement the router's and the director's methods (abstract); the readers' have a
default that says the backend cannot answer them, and the upkeep hooks (``keep_lock``,
``drop_orphans``) a default that has nothing to do.

Backends give a connection, their SQL dialect and their lock; the SQL itself is written once in
the ``sql`` package.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from exactly.errors import DirectorLockHeld, JobDBError

HELD = "one director runs per JobDB: stop the other one first, or wait for it to stop"
PARTITIONS_HELD = (
    "every partition is held by a running director: raise [delivery] partitions to run more "
    "directors, or let this one wait (a standby) without --no-wait"
)
STALE = 5.0  # seconds: a director whose heartbeat is older is not counted as live
REPLAYING = "wait for it to finish, then replay again"
AWAITING_SCHEDULING = "awaiting-scheduling"
EXECUTING = "executing"
SUCCEEDED = "succeeded"
DISCARDED = "discarded"
AWAITING_RETRY = "awaiting-retry"
EXPIRED = "expired"
ARCHIVING = "archiving"
ARCHIVED = "archived"
PENDING = (AWAITING_SCHEDULING, EXECUTING, AWAITING_RETRY)
TERMINAL = (SUCCEEDED, DISCARDED, EXPIRED)
STATES = (*PENDING, *TERMINAL, ARCHIVING, ARCHIVED)
MAX_RESPONSE = 1024  # characters of a response body kept with a transition


def bucket_of(source: str, destination: str) -> str:
    """The queue a job waits in: one per source × destination (names cannot contain '/')."""
    return f"{source}/{destination}"


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

    @property
    def bucket(self) -> str:
        return bucket_of(self.source, self.destination)


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

    @property
    def queued(self) -> int:
        return self.states.get(AWAITING_SCHEDULING, 0) + self.states.get(EXECUTING, 0)

    @property
    def rate_per_second(self) -> float:
        """Deliveries per second over the last minute."""
        return self.succeeded_last_minute / 60.0


class JobDB(ABC):
    """The interface every JobDB backend keeps; open one with
    :func:`exactly.delivery.jobdb.open_jobdb`. The SQL that implements it for every backend is
    in :mod:`exactly.delivery.jobdb.sql`."""

    url: str

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        from exactly.urls import redact

        return redact(self.url)

    def __enter__(self) -> JobDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def close(self) -> None:
        """Close the connection (the next call opens another)."""

    # -- the router's ----------------------------------------------------------------------------

    @abstractmethod
    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        stream: str | None = None,
        end_offsets: Mapping[int, int] | None = None,
    ) -> int:
        """Add a micro-batch's jobs with its marker in one transaction; how many were added.

        ``stream`` and ``end_offsets`` (partition -> next offset), when given, are kept with the
        marker: where this batch ended in what the router reads.
        """

    @abstractmethod
    def marker(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""

    @abstractmethod
    def end_offsets(self, stream: str) -> dict[int, int] | None:
        """Where the newest batch added from ``stream`` ended (by any query id), or None."""

    # -- the director's --------------------------------------------------------------------------

    @abstractmethod
    def director_lock(self, *, wait: bool = True) -> AbstractContextManager[None]:
        """Hold the director's lock while inside; wait for it, or raise DirectorLockHeld."""

    @abstractmethod
    def buckets(self) -> list[str]:
        """Buckets that have jobs in a live dataset."""

    @abstractmethod
    def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``bucket`` not yet terminal, by id, with ids above ``after``."""

    @abstractmethod
    def unpaged(self, bucket: str, *, after: int) -> int:
        """How many jobs of ``bucket`` have ids above ``after``: those the director, whose cursor
        is ``after``, has not paged in yet (all still ``awaiting-scheduling``)."""

    @abstractmethod
    def record(
        self,
        transitions: Sequence[Transition],
        *,
        batches: Sequence[Batch] = (),
        steps: Sequence[BatchStep] = (),
        members: Sequence[Members] = (),
    ) -> None:
        """Append ``transitions``, new ``batches``, batch ``steps`` and the transitions
        ``members`` stand for in one transaction, durable on return.

        A batch is recorded once, when formed, with its first step (its row lists its
        members); its attempts are steps of the batch alone; when it ends, its final step comes
        with each member's terminal transition. So a batch costs its members one transition
        each, however many attempts it takes.
        """

    @abstractmethod
    def open_batches(self, bucket: str) -> list[OpenBatch]:
        """The batches of ``bucket`` not yet ended, oldest first, with their member jobs: what
        a director resends (executing at a crash) or retries (awaiting-retry) after a start."""

    @abstractmethod
    def datasets(self) -> list[Dataset]:
        """The live datasets, oldest first."""

    @abstractmethod
    def archivable(self) -> list[int]:
        """Closed datasets (not the newest) whose jobs are all terminal, archiving or archived."""

    @abstractmethod
    def archive(
        self,
        number: int,
        write: Callable[[Iterator[dict[str, Any]]], object],
        *,
        drop: bool = True,
    ) -> None:
        """Archive dataset ``number`` through ``write(records)`` and drop its tables (with
        ``drop=False`` stop before the drop: the next call finds it archived and drops it)."""

    # -- many directors: partition leases and heartbeats -----------------------------------------

    @abstractmethod
    def take_partition(self, partition: int) -> bool:
        """Take the lease of ``partition`` without waiting; whether it is now held here. A
        lease is released by the database or the kernel when its holder dies."""

    @abstractmethod
    def release_partition(self, partition: int) -> None:
        """Release the lease of ``partition`` (only once nothing of it is being sent)."""

    @abstractmethod
    def held_partitions(self) -> set[int]:
        """The partitions whose lease this JobDB object holds."""

    def keep_partitions(self) -> None:  # noqa: B027 (a lease that cannot be lost needs nothing)
        """Check the leases are still held, taking them again on a new connection if the one
        that held them was lost; raise PartitionLost if another director took one meanwhile."""

    @abstractmethod
    def heartbeat(self, director: str, partitions: Sequence[int], now: float) -> int:
        """Record that ``director`` is alive holding ``partitions``; how many directors are
        live (a heartbeat within :data:`STALE` seconds, this one included)."""

    @abstractmethod
    def leave(self, director: str) -> None:
        """Forget ``director``'s heartbeat (it stops)."""

    @abstractmethod
    def directors(self) -> list[tuple[str, list[int], float]]:
        """Every director's heartbeat: its name, partitions and when it was last seen."""

    @contextlib.contextmanager
    def all_partitions(self, partitions: int, *, wait: bool = False) -> Iterator[None]:
        """Hold every partition's lease while inside (no director delivers meanwhile); wait for
        them, or raise DirectorLockHeld at once when one is held elsewhere."""
        taken: list[int] = []
        try:
            for partition in range(partitions):
                while not self.take_partition(partition):
                    if not wait:
                        raise DirectorLockHeld(
                            f"a director holds partition {partition} of {self.describe()}; {HELD}"
                        )
                    time.sleep(0.2)
                taken.append(partition)
            yield
        finally:
            for partition in taken:
                with contextlib.suppress(Exception):
                    self.release_partition(partition)

    # -- the director's upkeep: nothing to do unless a backend needs it ---------------------------

    def keep_lock(self) -> None:  # noqa: B027 (a lock that cannot be lost needs nothing)
        """Check the director lock is still held, taking it again if the connection that held
        it was lost (a restarted server, a terminated backend); raise DirectorLockHeld if another
        director took it meanwhile. A lock that cannot be lost (SQLite's flock) has nothing to
        check."""

    def drop_orphans(self) -> list[int]:
        """Drop dataset tables no dataset lists (left by a crash); the dataset numbers dropped.
        A backend without such tables has none."""
        return []

    # -- the readers' (deliveries, trace, replay, the console) -----------------------------------

    def history(self, job_id: int) -> list[Transition]:
        """Every transition of ``job_id``, oldest first."""
        raise self._cannot("history")

    def states(self) -> dict[str, dict[str, int]]:
        """Per destination, how many jobs are in each latest state (live datasets only)."""
        raise self._cannot("states")

    def batch_history(self, batch_id: str) -> tuple[Batch, list[BatchStep]] | None:
        """A batch with every step of it, oldest first; None once its datasets are dropped."""
        raise self._cannot("batch_history")

    def batch_of(self, destination: str, job_id: int) -> str | None:
        """The id of the batch ``job_id`` was sent in to ``destination``; None for a job sent
        on its own (or not sent yet)."""
        raise self._cannot("batch_of")

    def summary(self, now: float | None = None) -> dict[str, Summary]:
        """Per destination: jobs per state, the oldest pending job's age, the last error and the
        jobs that succeeded in the minute before ``now``."""
        raise self._cannot("summary")

    def recent_successes(self, since: float, limit: int) -> list[tuple[float, bytes]]:
        """(time, payload) of at most ``limit`` of the newest jobs that succeeded after ``since``
        (the console's latency to delivered)."""
        raise self._cannot("recent_successes")

    def jobs_of(self, destination: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``destination`` in the live datasets with ids above ``after``,
        by id, each with its outcome as ``state``: its latest state other than ``archiving`` and
        ``archived``. A dataset dropped meanwhile is skipped (its jobs are in the archive)."""
        raise self._cannot("jobs_of")

    def jobs_with(self, message_id: str) -> list[tuple[Job, list[Transition]]]:
        """Every job of ``message_id`` in the live datasets, each with its transitions oldest
        first (``exactly trace``; archived datasets are in the archive)."""
        raise self._cannot("jobs_with")

    def move_marker(self, query_id: str, batch_id: int) -> None:
        """Raise the marker of ``query_id`` to ``batch_id`` without adding jobs (never lower)."""
        raise self._cannot("move_marker")

    def replay_lock(self, destination: str) -> AbstractContextManager[None]:
        """Hold ``destination``'s replay lock while inside, or raise ReplayRunning at once; the
        database or the kernel releases it when its holder dies, however it dies."""
        raise self._cannot("replay_lock")

    # -- controls: written by operators' commands and by the director, read by both -------------

    def controls(self) -> dict[str, Control]:
        """Every destination's :class:`Control` that was ever set, by name."""
        raise self._cannot("controls")

    def set_control(self, destination: str, **fields: Any) -> None:
        """Set some of ``destination``'s control fields (:data:`CONTROL_FIELDS`), durably."""
        raise self._cannot("set_control")

    def answer_expiry(
        self, destination: str, asked: float, partitions: Sequence[int], count: int
    ) -> None:
        """A director has expired ``count`` jobs of ``destination`` in ``partitions`` for the
        ask made at ``asked``: add both to the row, in one transaction (several directors answer
        the same ask, each for its partitions); nothing if a newer ask replaced it."""
        raise self._cannot("answer_expiry")

    def _cannot(self, what: str) -> JobDBError:
        return JobDBError(f"the JobDB {self.describe()} cannot answer {what}")
