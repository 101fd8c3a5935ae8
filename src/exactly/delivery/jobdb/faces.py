"""The JobDB as each of its users sees it: one narrow face per role.

There is one JobDB, :class:`~exactly.delivery.jobdb.JobDB` (the SQL in the ``sql`` package, over
SQLite, PostgreSQL or MariaDB), and each user takes it as the face of its role, listing exactly
the methods that role calls; mypy holds each user to its face:

* :class:`RouterJobs`: the route query (``route.py``, ``stages.py``) adds a micro-batch's jobs
  with its marker and finds where routing stopped;
* :class:`BackfillJobs`: ``exactly backfill`` (``backfill.py``) reads what routing covered and
  adds a chunk's jobs with the span it covers, under its lock;
* :class:`ReplayJobs`: ``exactly replay`` (``replay.py``) reads finished jobs and enqueues them
  again, under its lock and with markers of its own;
* :class:`DirectorJobs`: the director (``director/``) pages jobs in, records what happened to
  them, holds partition leases, applies the operators' controls and archives datasets;
* :class:`OperatorJobs`: ``exactly deliveries pause | resume | expire`` (``operators.py``) set a
  destination's control, or expire its jobs at once holding every partition;
* :class:`JobReader`: the readers (``exactly deliveries``, ``status``, ``trace``, ``up``'s view
  and the console) look jobs up and count them, writing nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from exactly.delivery.jobdb.base import (
    Batch,
    BatchStep,
    Control,
    Dataset,
    Job,
    Members,
    NewJob,
    OpenBatch,
    RouteCounts,
    Span,
    Summary,
    Transition,
)


class RouterJobs(Protocol):
    """What the route query calls: ``add`` with the marker, ``marker``, ``end_offsets``."""

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        ...

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        ...

    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        stream: str | None = None,
        end_offsets: Mapping[int, int] | None = None,
        counts: Mapping[str, RouteCounts] | None = None,
        origin: str = "route",
    ) -> int:
        """Add a micro-batch's jobs with its marker in one transaction; how many were added.
        A batch id not above the marker of ``query_id`` adds nothing. ``stream`` and
        ``end_offsets`` (partition -> next offset) are kept with the marker; ``counts`` (per
        destination) are added to ``origin``'s in the same transaction."""
        ...

    def marker(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""
        ...

    def end_offsets(self, stream: str) -> dict[int, int] | None:
        """Where the newest batch added from ``stream`` ended (by any query id), or None."""
        ...

    def open_routes(self, stream: str, topic: str, destinations: Sequence[str]) -> None:
        """Open a route span for each destination newly routed from ``stream``, from where its
        newest batch ended, and close those of destinations it no longer routes."""
        ...


class BackfillJobs(Protocol):
    """What ``exactly backfill`` calls: its lock, the spans, ``add`` with its span."""

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        ...

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        ...

    def replay_lock(self, destination: str, kind: str = "replay") -> AbstractContextManager[None]:
        """Hold ``destination``'s lock of ``kind`` while inside, or raise ReplayRunning."""
        ...

    def spans(self, destination: str, topic: str) -> list[Span]:
        """Every span of ``destination`` over ``topic``: routes and backfills, open or not."""
        ...

    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        counts: Mapping[str, RouteCounts] | None = None,
        origin: str = "route",
        span: Span | None = None,
    ) -> int:
        """Add a chunk's jobs, counts and span with the marker of ``query_id``, at once."""
        ...


class ReplayJobs(Protocol):
    """What ``exactly replay`` calls: its lock, its markers, the live jobs, ``add``."""

    def replay_lock(self, destination: str, kind: str = "replay") -> AbstractContextManager[None]:
        """Hold ``destination``'s replay lock while inside, or raise ReplayRunning at once; the
        database or the kernel releases it when its holder dies, however it dies."""
        ...

    def marker(self, query_id: str) -> int | None:
        """The last batch id committed for ``query_id``, or None."""
        ...

    def move_marker(self, query_id: str, batch_id: int) -> None:
        """Raise the marker of ``query_id`` to ``batch_id`` without adding jobs (never lower)."""
        ...

    def jobs_of(self, destination: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``destination`` in the live datasets with ids above
        ``after``, by id, each with its outcome as ``state`` (not ``archiving``/``archived``)."""
        ...

    def add(
        self,
        jobs: Sequence[NewJob],
        *,
        query_id: str,
        batch_id: int,
        stream: str | None = None,
        end_offsets: Mapping[int, int] | None = None,
    ) -> int:
        """Add jobs with the marker of ``query_id`` in one transaction (as the router does)."""
        ...


class DirectorJobs(Protocol):
    """What the director calls: paging and recording, leases and heartbeats, controls, upkeep.

    ``url`` opens a second connection of the same JobDB (paging, archiving aside)."""

    url: str

    def describe(self) -> str:
        """The URL with its secrets masked, for messages."""
        ...

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        ...

    # -- jobs ------------------------------------------------------------------------------------

    def buckets(self) -> list[str]:
        """Buckets that have jobs in a live dataset."""
        ...

    def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``bucket`` not yet terminal, by id, with ids above ``after``."""
        ...

    def unpaged(self, bucket: str, *, after: int) -> int:
        """How many jobs of ``bucket`` have ids above ``after`` (not paged in yet)."""
        ...

    def record(
        self,
        transitions: Sequence[Transition],
        *,
        batches: Sequence[Batch] = (),
        steps: Sequence[BatchStep] = (),
        members: Sequence[Members] = (),
    ) -> None:
        """Append ``transitions``, new ``batches``, batch ``steps`` and the transitions
        ``members`` stand for in one transaction, durable on return."""
        ...

    def open_batches(self, bucket: str) -> list[OpenBatch]:
        """The batches of ``bucket`` not yet ended, oldest first, with their member jobs."""
        ...

    # -- partition leases and heartbeats ---------------------------------------------------------

    def take_partition(self, partition: int) -> bool:
        """Take the lease of ``partition`` without waiting; whether it is now held here."""
        ...

    def release_partition(self, partition: int) -> None:
        """Release the lease of ``partition`` (only once nothing of it is being sent)."""
        ...

    def keep_partitions(self) -> None:
        """Check the leases are still held (taking them again on a new connection); raise
        PartitionLost if another director took one meanwhile."""
        ...

    def heartbeat(self, director: str, partitions: Sequence[int], now: float) -> int:
        """Record that ``director`` is alive holding ``partitions``; how many are live."""
        ...

    def leave(self, director: str) -> None:
        """Forget ``director``'s heartbeat (it stops)."""
        ...

    # -- controls --------------------------------------------------------------------------------

    def controls(self) -> dict[str, Control]:
        """Every destination's :class:`Control` that was ever set, by name."""
        ...

    def set_control(self, destination: str, **fields: Any) -> None:
        """Set some of ``destination``'s control fields (the breaker's, here), durably."""
        ...

    def answer_expiry(
        self, destination: str, asked: float, partitions: Sequence[int], count: int
    ) -> None:
        """This director expired ``count`` jobs of ``destination`` in ``partitions`` for the
        ask made at ``asked``."""
        ...

    # -- upkeep: datasets, the archive -----------------------------------------------------------

    def datasets(self) -> list[Dataset]:
        """The live datasets, oldest first."""
        ...

    def archivable(self) -> list[int]:
        """Closed datasets (not the newest) whose jobs are all terminal, archiving or archived."""
        ...

    def archive(
        self,
        number: int,
        write: Callable[[Iterator[dict[str, Any]]], object],
        *,
        drop: bool = True,
    ) -> None:
        """Archive dataset ``number`` through ``write(records)`` and drop its tables (with
        ``drop=False`` stop before the drop)."""
        ...

    def drop_orphans(self) -> list[int]:
        """Drop dataset tables no dataset lists (left by a crash); the numbers dropped."""
        ...

    def forget_jobs(self, matches: Callable[[str, str | None, bytes], bool]) -> tuple[int, int]:
        """Expire the queued jobs ``matches`` picks (message id, user id, payload) and empty
        every one it picks, old bytes scrubbed (``exactly forget``); (expired, emptied).
        Only while no other director sends."""
        ...


class OperatorJobs(Protocol):
    """What the operators' commands call: a destination's control, and expiring its jobs at
    once while holding every partition (no director runs meanwhile)."""

    def controls(self) -> dict[str, Control]:
        """Every destination's :class:`Control` that was ever set, by name."""
        ...

    def set_control(self, destination: str, **fields: Any) -> None:
        """Set some of ``destination``'s control fields, durably."""
        ...

    def all_partitions(
        self, partitions: int, *, wait: bool = False
    ) -> AbstractContextManager[None]:
        """Hold every partition's lease while inside, or raise DirectorLockHeld."""
        ...

    def buckets(self) -> list[str]:
        """Buckets that have jobs in a live dataset."""
        ...

    def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
        """Up to ``limit`` jobs of ``bucket`` not yet terminal, by id, with ids above ``after``."""
        ...

    def record(
        self,
        transitions: Sequence[Transition],
        *,
        batches: Sequence[Batch] = (),
        steps: Sequence[BatchStep] = (),
        members: Sequence[Members] = (),
    ) -> None:
        """Append ``transitions`` in one transaction, durable on return."""
        ...


class JobReader(Protocol):
    """What the readers call: summaries, directors, a message's jobs and batches."""

    def close(self) -> None:
        """Close the connection (the next call opens another)."""
        ...

    def summary(self, now: float | None = None) -> dict[str, Summary]:
        """Per destination: jobs per state, the oldest pending job's age, the last error and
        the jobs that succeeded in the minute before ``now``."""
        ...

    def directors(self) -> list[tuple[str, list[int], float]]:
        """Every director's heartbeat: its name, partitions and when it was last seen."""
        ...

    def jobs_with(self, message_id: str) -> list[tuple[Job, list[Transition]]]:
        """Every job of ``message_id`` in the live datasets, each with its transitions."""
        ...

    def route_counts(self) -> dict[str, RouteCounts]:
        """Per destination, the events routing (and backfill) chose not to send it."""
        ...

    def batch_of(self, destination: str, job_id: int) -> str | None:
        """The id of the batch ``job_id`` was sent in to ``destination``; None if alone."""
        ...

    def batch_history(self, batch_id: str) -> tuple[Batch, list[BatchStep]] | None:
        """A batch with every step of it, oldest first; None once its datasets are dropped."""
        ...

    def recent_successes(self, since: float, limit: int) -> list[tuple[float, bytes]]:
        """(time, payload) of at most ``limit`` of the newest jobs that succeeded after
        ``since``."""
        ...
