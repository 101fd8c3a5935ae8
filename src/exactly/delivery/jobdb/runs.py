"""A micro-batch's jobs as the route query makes them, with no object per event.

A single-event destination takes a job per event it takes: tens of thousands a micro-batch.
:class:`JobRun` holds one destination's such jobs as columns (the micro-batch's own lists, or
what its ``takes`` picked of them), and :class:`RoutedJobs` a micro-batch's runs, packs and
other jobs in the order they are added. Both read as sequences of
:class:`~exactly.delivery.jobdb.base.NewJob` (made on demand, for tests and reports); the
JobDB's insert reads their columns straight (:func:`job_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, overload

from exactly.delivery.jobdb.base import NewJob, bucket_of

DEFAULT_LIFETIME = 4 * 3600.0  # seconds a job lives when its expiry is 0
JobRow = tuple[int, str, str, bytes, str, str | None, float, float, int]


@dataclass(frozen=True)
class JobRun(Sequence[NewJob]):
    """One destination's single-event jobs of a micro-batch, as columns in log order."""

    destination: str
    sources: Sequence[str]
    payloads: Sequence[bytes]
    message_ids: Sequence[str]
    user_ids: Sequence[str | None]
    expire_at: float = 0.0
    lanes: Sequence[int] = ()  # each job's lane; empty: every job in lane 0

    def __len__(self) -> int:
        return len(self.payloads)

    @overload
    def __getitem__(self, index: int) -> NewJob: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewJob]: ...

    def __getitem__(self, index: int | slice) -> NewJob | list[NewJob]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return NewJob(
            self.sources[index],
            self.destination,
            self.payloads[index],
            self.message_ids[index],
            self.user_ids[index],
            self.expire_at,
            lane=self.lanes[index] if self.lanes else 0,
        )

    def __iter__(self) -> Iterator[NewJob]:
        return (self[index] for index in range(len(self)))

    def buckets(self) -> Sequence[str]:
        """Each job's bucket (:func:`~exactly.delivery.jobdb.base.bucket_of`), each name
        made once."""
        if not self.lanes and len(set(self.sources)) <= 1:  # one source, one lane: one bucket
            return [bucket_of(self.sources[0], self.destination)] * len(self) if self else []
        names: dict[tuple[str, int], str] = {}
        made = []
        for key in zip(self.sources, self.lanes or repeat(0), strict=False):
            name = names.get(key)
            if name is None:
                name = names[key] = bucket_of(key[0], self.destination, key[1])
            made.append(name)
        return made


class RoutedJobs(Sequence[NewJob]):
    """A micro-batch's jobs in the order they are added: runs, packs and single jobs."""

    def __init__(self, parts: Iterable[NewJob | JobRun] = ()) -> None:
        self.parts: list[NewJob | JobRun] = [part for part in parts if len_of(part)]

    def add(self, part: NewJob | JobRun) -> None:
        if len_of(part):
            self.parts.append(part)

    def extend(self, jobs: Iterable[NewJob]) -> None:
        self.parts.extend(jobs)

    def __len__(self) -> int:
        return sum(map(len_of, self.parts))

    @overload
    def __getitem__(self, index: int) -> NewJob: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewJob]: ...

    def __getitem__(self, index: int | slice) -> NewJob | list[NewJob]:
        return list(self)[index]

    def __iter__(self) -> Iterator[NewJob]:
        return chain.from_iterable(
            part if isinstance(part, JobRun) else (part,) for part in self.parts
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a changing container, as a list is

    def __repr__(self) -> str:
        return f"RoutedJobs({len(self)} jobs in {len(self.parts)} parts)"


def len_of(part: NewJob | JobRun) -> int:
    return len(part) if isinstance(part, JobRun) else 1


def events_of(jobs: Sequence[NewJob]) -> int:
    """The events ``jobs`` carry: a pack's members, one for any other job."""
    parts: Sequence[Any] = jobs.parts if isinstance(jobs, RoutedJobs) else jobs
    return sum(len(part) if isinstance(part, JobRun) else part.events for part in parts)


def job_rows(
    jobs: Sequence[NewJob], first_id: int, now: float
) -> tuple[list[JobRow], list[tuple[int, str]]]:
    """The rows of ``jobs`` for ``jobs_N`` (``JOB_COLUMNS`` and ``events``), ids from
    ``first_id`` on (a pack takes as many as it has members, so a dataset fills by events),
    and the (id, error) of each job whose transform failed."""
    parts: Sequence[Any] = jobs.parts if isinstance(jobs, RoutedJobs) else jobs
    rows: list[JobRow] = []
    failed: list[tuple[int, str]] = []
    next_id = first_id
    for part in parts:
        if isinstance(part, JobRun):
            size = len(part)
            rows += zip(
                range(next_id, next_id + size),
                part.buckets(),
                repeat(part.destination, size),
                part.payloads,
                part.message_ids,
                part.user_ids,
                repeat(now, size),
                repeat(part.expire_at or now + DEFAULT_LIFETIME, size),
                repeat(1, size),
                strict=True,
            )
            next_id += size
            continue
        job: NewJob = part
        events = job.events
        rows.append(
            (
                next_id,
                job.bucket,
                job.destination,
                job.payload,
                job.message_id,
                job.user_id,
                now,
                job.expire_at or now + DEFAULT_LIFETIME,
                events,
            )
        )
        if job.error is not None:
            failed.append((next_id, job.error))
        next_id += events
    return rows, failed
