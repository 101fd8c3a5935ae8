"""A destination's jobs in the director's memory: one queue per bucket, taken in turn.

A bucket (source × destination) keeps its own queue, retry times and, for an ordered
destination, its users with a job out: a slow source or a failing user grows its own queue only.
What the receiver can take is the destination's: its requests in flight (``max_in_flight``), its
rate and its pauses (:mod:`exactly.delivery.pacing`) are shared by its buckets, which
:meth:`Destination.take` serves in turn, one job each, so a source with a million jobs queued
delays a source with ten by at most one request per turn.

A batching destination (``batch.max_events`` above 1) takes batches instead of jobs
(:meth:`Destination.form`): each from one bucket, buckets in turn, a batch's retries before new
ones; a partial batch waits until ``max_wait`` has passed since its oldest job was ready. A
batch counts as one request against ``max_in_flight`` and the rate.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exactly.delivery.batches import cut
from exactly.delivery.client import Client
from exactly.delivery.jobdb.base import AWAITING_RETRY, Job
from exactly.delivery.pacing import Pace
from exactly.delivery.settings import BatchSettings, DestinationSettings

if TYPE_CHECKING:
    from exactly.delivery.director.shipment import BatchShipment, Origin, Shipment


@dataclass
class Bucket:
    """One source's jobs for one destination, as paged in from the JobDB."""

    name: str
    ordered: bool
    ready: deque[Job] = field(default_factory=deque)
    retries: list[tuple[float, int, Job]] = field(default_factory=list)  # a heap by retry time
    taken: int = 0  # taken and not yet answered (being recorded, waiting to leave, in flight)
    cursor: int = 0  # the highest job id paged in
    caught_up: bool = False
    paged_at: float = 0.0
    users_out: set[str] = field(default_factory=set)  # ordered: users with a job taken
    # batching: batches to send again (retry time, seq, batch), the members of batches a
    # previous run left open (never paged in as new jobs), when the oldest ready job got ready
    batches: list[tuple[float, int, BatchShipment]] = field(default_factory=list)
    in_batches: set[int] = field(default_factory=set)
    ready_since: float | None = None
    loaded: bool = False
    # packs (docs/delivery.md): the events the packs held carry beyond one each, so that what
    # a bucket holds is bounded in events; and whether the last page read held packs
    extra: int = 0
    packs: bool = False

    @property
    def held(self) -> int:
        return len(self.ready) + len(self.retries) + self.taken

    @property
    def held_events(self) -> int:
        """What it holds counted in events (a pack counts its members): bounded by the page."""
        return self.held + self.extra

    @property
    def idle(self) -> bool:
        return self.held == 0 and self.caught_up

    def place(
        self, jobs: list[Job], now: float, keep: Callable[[Job], Job | None] | None = None
    ) -> None:
        """Jobs paged in: ready now, or waiting for their retry time (an ordered bucket keeps
        every job in ``ready``, by id, and :meth:`next_jobs` skips those not yet due). ``keep``
        gives each job back as it may be sent, or none (a forgotten person's: the cursor still
        moves past it); what was placed before is not looked at again (:meth:`reshape` is for
        that, when what ``keep`` drops changes)."""
        for found in jobs:
            self.cursor = max(self.cursor, found.id)
            job = found if keep is None else keep(found)
            if job is None:
                continue
            if job.packed:
                self.extra += job.events - 1
            if job.id in self.in_batches:  # a member of a batch loaded open: sent as such
                self.in_batches.discard(job.id)
                continue
            if job.state == AWAITING_RETRY and job.retry_at is not None and job.retry_at > now:
                heapq.heappush(self.retries, (job.retry_at, job.id, job))
            else:
                self.ready.append(job)
        if self.ordered and self.retries:
            jobs_by_id = [*self.ready, *(entry[2] for entry in self.retries)]
            self.ready, self.retries = deque(sorted(jobs_by_id, key=_id)), []

    def due(self, now: float) -> None:
        """Move the jobs whose retry time has come to ``ready``."""
        while self.retries and self.retries[0][0] <= now:
            self.ready.append(heapq.heappop(self.retries)[2])

    def again(self, job: Job) -> None:
        """A job to retry at its ``retry_at``."""
        assert job.retry_at is not None
        if self.ordered:
            self.ready = deque(sorted([*self.ready, job], key=_id))
        else:
            heapq.heappush(self.retries, (job.retry_at, job.id, job))

    def next_jobs(self, limit: int, now: float) -> tuple[list[Job], float | None]:
        """Up to ``limit`` jobs that may be taken now, removed from ``ready``; and, for an
        ordered bucket, the seconds until a held-back job's retry time.

        An ordered bucket sends a user's next job only when the one before it has ended: a user
        with a job out or waiting to retry holds back that user's later jobs, never another's.
        """
        if not self.ordered:
            count = min(limit, len(self.ready))
            return [self.ready.popleft() for _ in range(count)], None
        taken: list[Job] = []
        kept: deque[Job] = deque()
        blocked = set(self.users_out)
        wait: float | None = None
        while self.ready:
            job = self.ready.popleft()
            user = job.user_id or ""
            if len(taken) >= limit or user in blocked:
                kept.append(job)
                continue
            blocked.add(user)
            if job.retry_at is not None and job.retry_at > now:
                kept.append(job)
                wait = job.retry_at - now if wait is None else min(wait, job.retry_at - now)
                continue
            taken.append(job)
        self.ready = kept
        return taken, wait

    def next_batch(self, now: float, limits: BatchSettings) -> tuple[list[Job], float | None]:
        """The jobs of the next batch, removed from ``ready``, when it is full or its oldest job
        has waited ``max_wait``; else none and the seconds until it may leave partial.

        Ordered: in id order, skipping users with a job out (a batch may carry several jobs of
        one user, in order; they are held until the batch ends)."""
        if not self.ready:
            self.ready_since = None
            return [], None
        if self.ready_since is None:
            self.ready_since = now
        if self.ready[0].packed:  # a batch the route query made: it goes as it is, alone
            self.ready_since = None
            self.taken += 1
            return [self.ready.popleft()], None
        if self.ordered:
            blocked = set(self.users_out)
            candidates: list[Job] = []
            for job in self.ready:
                user = job.user_id or ""
                if user in blocked:
                    continue
                if job.retry_at is not None and job.retry_at > now:
                    blocked.add(user)
                    continue
                if job.packed:  # taken alone when it comes first
                    break
                candidates.append(job)
                if len(candidates) > limits.max_events:
                    break
        else:
            candidates = []
            for at in range(min(len(self.ready), limits.max_events)):
                if self.ready[at].packed:  # taken alone when it comes first
                    break
                candidates.append(self.ready[at])
        count, full = cut(
            (len(job.payload) for job in candidates),
            max_events=limits.max_events,
            max_bytes=limits.max_bytes,
            form=limits.format,
        )
        if not count:
            return [], None
        if not full and now - self.ready_since < limits.max_wait:
            return [], self.ready_since + limits.max_wait - now
        taken = candidates[:count]
        if self.ordered:
            chosen = {job.id for job in taken}
            self.ready = deque(job for job in self.ready if job.id not in chosen)
            self.users_out.update(job.user_id or "" for job in taken)
        else:
            for _ in range(count):
                self.ready.popleft()
        if not self.ready:
            self.ready_since = None
        self.taken += count
        return taken, None

    def drop(self, matches: Callable[[Job], bool]) -> list[Job]:
        """Remove the waiting jobs (ready or to retry) that ``matches``; those removed."""
        dropped = [job for job in self.ready if matches(job)]
        dropped += [entry[2] for entry in self.retries if matches(entry[2])]
        if dropped:
            self.ready = deque(job for job in self.ready if not matches(job))
            self.retries = [entry for entry in self.retries if not matches(entry[2])]
            heapq.heapify(self.retries)
            self.extra -= sum(job.events - 1 for job in dropped)
        return dropped

    def reshape(self, keep: Callable[[Job], Job | None]) -> int:
        """Each waiting job (ready or to retry) as ``keep`` gives it back: the same, another
        (a pack with members taken out), or none (dropped); the events that went."""
        gone = 0

        def kept(job: Job) -> Job | None:
            nonlocal gone
            found = keep(job)
            events = 0 if found is None else found.events
            gone += job.events - events
            self.extra -= job.events - max(events, 1)
            return found

        ready = (kept(job) for job in self.ready)
        self.ready = deque(job for job in ready if job is not None)
        retries = ((entry[0], entry[1], kept(entry[2])) for entry in self.retries)
        self.retries = [(at, seq, job) for at, seq, job in retries if job is not None]
        heapq.heapify(self.retries)
        return gone

    def give_back(self, jobs: list[Job]) -> None:
        """Jobs from :meth:`next_jobs` that were not taken after all, in their places."""
        if not jobs:
            return
        if self.ordered:
            self.ready = deque(sorted([*self.ready, *jobs], key=_id))
        else:
            self.ready.extendleft(reversed(jobs))


@dataclass
class Destination:
    """One receiver: its settings, HTTP client, pacing, buckets and the jobs on their way."""

    settings: DestinationSettings
    pace: Pace
    client: Client = field(repr=False)
    # the secrets' HMAC keys, decoded once, and the headers sent on every request (credentials
    # among them: never in a repr)
    keys: tuple[bytes, ...] = field(default=(), repr=False)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    buckets: list[Bucket] = field(default_factory=list)
    outbox: deque[Shipment] = field(default_factory=deque)  # recorded, not yet sent
    senders: int = 0
    batches_out: int = 0  # batching: batches taken for an attempt, not yet answered
    turn: int = 0  # the bucket served first at the next take
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def taken(self) -> int:
        return sum(bucket.taken for bucket in self.buckets)

    @property
    def reserve(self) -> int:
        """Jobs taken at once: twice the requests that may be out (``max_in_flight``, or the
        window a 429 narrowed, :meth:`~exactly.delivery.pacing.Pace.allowed`), so the next
        jobs' ``executing`` commits while the current requests are out; only
        ``max_in_flight`` when paced or ordered, where a job taken early would wait recorded.
        Senders bound the requests to the window."""
        settings = self.settings
        if settings.rate is not None or settings.ordered:
            return settings.max_in_flight
        return 2 * self.pace.allowed(settings.max_in_flight)

    def take(self, now: float) -> tuple[list[tuple[Bucket, Job]], float | None]:
        """Jobs to record ``executing`` and send, one bucket after another in turn, up to the
        reserve; and the seconds until an ordered job held back for its retry time is due."""
        room = self.reserve - self.taken
        wait: float | None = None
        if room <= 0 or not self.buckets:
            return [], None
        count = len(self.buckets)
        start = self.turn % count
        order = self.buckets[start:] + self.buckets[:start]
        offers: list[deque[Job]] = []
        for bucket in order:
            jobs, held_back = bucket.next_jobs(room, now)
            offers.append(deque(jobs))
            if held_back is not None:
                wait = held_back if wait is None else min(wait, held_back)
        chosen: list[tuple[Bucket, Job]] = []
        last = -1  # the place in ``order`` of the bucket served last: the next take starts after
        while len(chosen) < room and any(offers):
            for at, (bucket, offer) in enumerate(zip(order, offers, strict=True)):
                if offer and len(chosen) < room:
                    chosen.append((bucket, offer.popleft()))
                    last = at
        for bucket, offer in zip(order, offers, strict=True):
            bucket.give_back(list(offer))
        for bucket, job in chosen:
            bucket.taken += 1
            if bucket.ordered:
                bucket.users_out.add(job.user_id or "")
        self.turn = start + last + 1 if chosen else start
        return chosen, wait

    def form(
        self, now: float
    ) -> tuple[list[BatchShipment | tuple[Bucket, list[Job]]], float | None]:
        """Batches to record and send, one bucket after another in turn, up to the reserve (in
        requests): batches due to be sent again, and new ones as ``(bucket, jobs)``; and the
        seconds until the next partial batch or retry is due."""
        room = self.reserve - self.batches_out
        if room <= 0 or not self.buckets:
            return [], None
        wait: float | None = None
        count = len(self.buckets)
        start = self.turn % count
        order = self.buckets[start:] + self.buckets[:start]
        chosen: list[BatchShipment | tuple[Bucket, list[Job]]] = []
        last = -1
        progress = True
        while progress and len(chosen) < room:
            progress = False
            for at, bucket in enumerate(order):
                if len(chosen) >= room:
                    break
                if bucket.batches and bucket.batches[0][0] <= now:
                    chosen.append(heapq.heappop(bucket.batches)[2])
                    progress, last = True, at
                    continue
                jobs, held_back = bucket.next_batch(now, self.settings.batch)
                if jobs:
                    chosen.append((bucket, jobs))
                    progress, last = True, at
                for due in (held_back, bucket.batches[0][0] - now if bucket.batches else None):
                    if due is not None:
                        wait = due if wait is None else min(wait, due)
        self.batches_out += len(chosen)
        self.turn = start + last + 1 if chosen else start
        return chosen, wait

    def batch_done(self, held: BatchShipment, *, ended: bool) -> None:
        """A batch's attempt has ended; with ``ended``, the batch too (its outcome recorded)."""
        self.batches_out -= 1
        if ended:
            self.batch_ended(held)
        self.wake.set()

    def request_ended(self) -> None:
        """A pack's attempt, taken as one of the batches out (:meth:`form`), has ended."""
        self.batches_out -= 1
        self.wake.set()

    def batch_ended(self, held: BatchShipment) -> None:
        bucket = held.bucket
        bucket.taken -= len(held.jobs)
        if bucket.ordered:
            bucket.users_out.difference_update(job.user_id or "" for job in held.jobs)
        self.wake.set()

    def done(self, bucket: Origin, job: Job) -> None:
        """A taken job's attempt has ended (its outcome recorded, or the recording failed)."""
        bucket.taken -= 1
        if bucket.ordered:
            bucket.users_out.discard(job.user_id or "")
        self.wake.set()


def _id(job: Job) -> int:
    return job.id


@dataclass
class Queues:
    """What a director holds in memory, by name: the destinations as configured, the queues of
    those with buckets in its partitions, and those buckets; each part of the director reads
    and changes these, never a copy."""

    configured: dict[str, DestinationSettings]
    destinations: dict[str, Destination] = field(default_factory=dict)
    buckets: dict[str, Bucket] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)  # buckets whose destination is not configured
    listed: list[str] = field(default_factory=list)  # every bucket of the JobDB, as last listed

    @property
    def idle(self) -> bool:
        """Whether no bucket held has a job in memory or more to page in."""
        return all(b.idle for d in self.destinations.values() for b in d.buckets)

    def keep(self, mine: Callable[[str], bool]) -> None:
        """Take nothing new from the buckets that are no longer ``mine`` (their partition is
        being given up): out of their destinations' turns and of the removed ones to expire.
        Their jobs out end as they would; the buckets are forgotten once the partition goes."""
        self.removed = {name for name in self.removed if mine(name)}
        for destination in self.destinations.values():
            destination.buckets = [b for b in destination.buckets if mine(b.name)]
            destination.wake.set()
