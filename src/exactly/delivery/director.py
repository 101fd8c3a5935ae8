"""The director: the process that sends the JobDB's jobs of its partitions to their destinations.

The JobDB's buckets are spread over ``partitions`` (:mod:`exactly.delivery.partitions`); a
director holds the lease of some of them and is the only writer of their jobs' transitions. It
looks every second for free partitions and keeps its fair share (:meth:`Director._lease`); a
director alone takes them all, and one started when every partition is held waits (a standby).

Jobs wait in memory in their bucket (source × destination), each
with its own queue and retry times, so a source with a backlog grows only its own queue. What a
receiver can take belongs to its destination and is shared by its buckets in turn
(:mod:`exactly.delivery.queues`): ``max_in_flight`` requests, the ``rate``, the pauses a 429 asks
for and the breaker of a failing endpoint (:mod:`exactly.delivery.pacing`). A job's URL, headers
and secret are the destination's as configured when its request leaves; the JobDB holds none of
them. Jobs are paged in per bucket (at most ``page_size`` held per bucket, in flight and waiting
to retry included), so memory stays bounded with millions queued.

Nothing one job or destination does stops the director: any error while a request is built or
sent is that attempt's failure, retried by the destination's rules (:mod:`.policy`).

Every attempt follows three steps, so a crash can duplicate only the requests in flight:

1. record ``executing`` (attempt n) and commit, for a whole batch of jobs at once;
2. send the request (the same ``Idempotency-Key`` / ``webhook-id`` on every attempt);
3. record the outcome (``succeeded``, ``discarded``, ``awaiting-retry`` with its time, ``expired``)
   and commit, group-committed with other outcomes.

On start the director pages in what is pending, including jobs a crash left ``executing`` between
steps 1 and 3: they are sent again, the one duplicate window, at most the requests that were in
flight. A receiver drops such copies by their idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import os
import random
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import uvloop

from exactly.errors import EnvironmentProblem

try:
    import aiohttp
except ImportError as error:  # pragma: no cover - depends on the installed packages
    raise EnvironmentProblem(
        f"the director needs aiohttp ({error}): pip install 'exactly[delivery]'"
    ) from None

from exactly.delivery.archive import Archive, archive_name
from exactly.delivery.batches import CONTENT_TYPES, batch_id, body
from exactly.delivery.failures import failure
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    MAX_RESPONSE,
    SUCCEEDED,
    Batch,
    BatchStep,
    Control,
    Job,
    JobDB,
    Members,
    Transition,
)
from exactly.delivery.metrics import DeliveryMetrics, Gauges
from exactly.delivery.operators import BY_OPERATOR
from exactly.delivery.pacing import Pace, result_of
from exactly.delivery.partitions import (
    fair_share,
    partition_of,
    portion,
    probe_order,
    rate_portion,
    to_release,
)
from exactly.delivery.patience import Patience
from exactly.delivery.policy import next_step, retry_after
from exactly.delivery.queues import Bucket, Destination, HeldBatch
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.signing import request_headers
from exactly.errors import DirectorLockHeld, ExactlyError, JobDBError

T = TypeVar("T")
REFILL = 1_000  # jobs: a bucket pages more in once it has room for this many


def say(message: str) -> None:
    print(f"deliver: {message}", file=sys.stderr, flush=True)


@dataclass
class Tally:
    """What one destination's requests came to during this run."""

    sent: int = 0
    succeeded: int = 0
    discarded: int = 0
    retried: int = 0
    expired: int = 0
    last_error: str | None = None


_Write = tuple[Sequence[Transition], Sequence[Batch], Sequence[BatchStep], Sequence[Members]]


class _Writer:
    """Group commit of transitions (and batches with their steps): callers wait until what
    they handed in is durable."""

    def __init__(self, call: Callable[..., Any], jobdb: JobDB) -> None:
        self._call = call
        self._jobdb = jobdb
        self._waiting: list[tuple[_Write, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._closing = False

    async def record(
        self,
        transitions: Sequence[Transition],
        *,
        batches: Sequence[Batch] = (),
        steps: Sequence[BatchStep] = (),
        members: Sequence[Members] = (),
    ) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(((transitions, batches, steps, members), future))
        self._wake.set()
        await future

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._waiting = self._waiting, []
            if not batch:
                if self._closing:
                    return
                continue
            transitions = [step for (writes, _, _, _), _ in batch for step in writes]
            formed = [one for (_, batches, _, _), _ in batch for one in batches]
            steps = [step for (_, _, steps, _), _ in batch for step in steps]
            members = [group for (_, _, _, groups), _ in batch for group in groups]
            try:
                if formed or steps or members:
                    await self._call(
                        self._jobdb.record,
                        transitions,
                        batches=formed,
                        steps=steps,
                        members=members,
                    )
                else:  # a destination without batches writes as it always did
                    await self._call(self._jobdb.record, transitions)
            except Exception as error:  # noqa: BLE001 (handed to every waiter)
                failure = (
                    error
                    if isinstance(error, JobDBError)
                    else JobDBError(
                        f"the JobDB {self._jobdb.describe()} refused a write ({error}); the "
                        "director stopped, and a restart resumes from what the JobDB holds"
                    )
                )
                for _, future in batch:
                    if not future.done():
                        future.set_exception(failure)
                continue
            for _, future in batch:
                if not future.done():
                    future.set_result(None)


class Director:
    """Sends the jobs of ``jobdb`` to ``destinations``; see the module docstring."""

    def __init__(
        self,
        jobdb: JobDB,
        destinations: Iterable[DestinationSettings],
        *,
        page_size: int = 10_000,
        poll_seconds: float = 0.2,
        jitter: Callable[[], float] | None = None,
        report: Callable[[str], None] = say,
        archive: Archive | None = None,
        archive_seconds: float = 5.0,
        metrics_port: int | None = None,
        jobdb_patience: float = 60.0,
        partitions: int = 1,
        lease_seconds: float = 1.0,
    ) -> None:
        self.jobdb = jobdb
        self.partitions = partitions
        self.lease_seconds = lease_seconds
        self.tag = f"{os.getpid()}.{random.getrandbits(32):08x}"  # X-Exactly-Director
        self.name = f"{socket.gethostname()}:{self.tag}"  # in jobdb_directors
        self._held: set[int] = set()  # partitions leased
        self._leaving: set[int] = set()  # leased, being given up: nothing new is sent
        self._leased_at = 0.0
        self._all_buckets: list[str] = []  # every bucket of the JobDB (for the limits' portions)
        self._breakers: dict[str, tuple[bool, float | None]] = {}  # as this director wrote them
        self.destinations = {destination.name: destination for destination in destinations}
        self.page_size = page_size
        self.poll_seconds = poll_seconds
        self.jitter = jitter
        self.report = report
        self.archive = archive
        self.archive_seconds = archive_seconds
        self.archived = 0
        self._archived_at = 0.0
        self.tallies = {name: Tally() for name in self.destinations}
        self._destinations: dict[str, Destination] = {}
        self._buckets: dict[str, Bucket] = {}
        self._removed: set[str] = set()  # buckets whose destination is no longer configured
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="jobdb")
        self._archiver = ThreadPoolExecutor(1, thread_name_prefix="archive")
        self._archiving: asyncio.Task[None] | None = None
        self._archive_db: JobDB | None = None
        self._paging = ThreadPoolExecutor(1, thread_name_prefix="jobdb-paging")
        self._paging_db: JobDB | None = None
        self._writer: _Writer | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self._failure: BaseException | None = None
        self.metrics_port = metrics_port
        self.jobdb_patience = jobdb_patience
        self._jobdb_failed = False
        self._lock_checked_at = 0.0
        self.metrics = None if metrics_port is None else DeliveryMetrics(lambda: self.tallies)
        self._measured_at = 0.0
        self._unpaged: dict[str, int] = {}
        self._unpaged_at = 0.0

    # -- running -------------------------------------------------------------------------------

    def run(self, *, until_drained: bool = False, wait: bool = True) -> dict[str, Tally]:
        """Hold the director lock and deliver until SIGTERM/SIGINT (or drained); the tallies."""
        if self.metrics is not None and self.metrics_port is not None:
            self.metrics.serve(self.metrics_port)
            self.report(f"metrics at http://127.0.0.1:{self.metrics_port}/metrics")
        try:
            return self._run(until_drained=until_drained, wait=wait)
        finally:
            if self.metrics is not None:
                self.metrics.close()

    def _run(self, *, until_drained: bool, wait: bool) -> dict[str, Tally]:
        described = self.jobdb.describe()
        if not self._take_first(wait=wait):
            raise DirectorLockHeld(
                f"another director holds the lock of {described} (each of its "
                f"{self.partitions} partitions is leased); {PARTITIONS_HELD}"
            )
        try:
            uvloop.run(self.deliver(until_drained=until_drained))
        finally:
            self._executor.shutdown(wait=True)
            self._paging.shutdown(wait=True)
            if self._paging_db is not None:
                self._paging_db.close()
            self._archiver.shutdown(wait=True)
            if self._archive_db is not None:
                self._archive_db.close()
            for partition in sorted(self._held):
                with contextlib.suppress(Exception):
                    self.jobdb.release_partition(partition)
            with contextlib.suppress(Exception):
                self.jobdb.leave(self.name)
        return self.tallies

    def _take_first(self, *, wait: bool) -> bool:
        """Lease a first partition before delivering (a standby waits here, its heartbeat
        counted, so the directors holding more than their share give some up)."""
        described = self.jobdb.describe()
        if wait:
            self.report(f"waiting for the director lock of {described} (a free partition)")
        else:
            self.report(f"taking the director lock of {described} (a free partition)")
        start = random.randrange(self.partitions)
        while True:
            live = self.jobdb.heartbeat(self.name, [], time.time())
            for partition in probe_order(self.partitions, start):
                if self.jobdb.take_partition(partition):
                    self._took(partition)
                    self.report(
                        f"holding the director lock (partition {partition} of "
                        f"{self.partitions}, {live} directors); delivering"
                    )
                    return True
            if not wait:
                self.jobdb.leave(self.name)
                return False
            time.sleep(self.lease_seconds)

    def _took(self, partition: int) -> None:
        self._held.add(partition)
        if partition == 0:  # its holder does the upkeep: tables a crash left unlisted
            for number in self.jobdb.drop_orphans():
                self.report(f"dropped the tables of dataset {number}, which no dataset lists")

    def _mine(self, bucket: str) -> bool:
        """Whether ``bucket`` is in a partition this director leases and keeps."""
        partition = partition_of(bucket, self.partitions)
        return partition in self._held and partition not in self._leaving

    async def _lease(self) -> None:
        """Every second: check the leases (a lost one stops the director: PartitionLost),
        heartbeat, give up partitions above the fair share ``ceil(P / live directors)`` (the
        highest first, never 0) once nothing of theirs is out, take free ones up to it, and
        set each destination's portion of its limits."""
        self._leased_at = time.time()
        await self._db(self.jobdb.keep_partitions)
        live = await self._db(self.jobdb.heartbeat, self.name, sorted(self._held), time.time())
        share = fair_share(self.partitions, live)
        for partition in to_release(self._held - self._leaving, share):
            self._leaving.add(partition)
            self._removed = {name for name in self._removed if self._mine(name)}
            for destination in self._destinations.values():
                destination.buckets = [b for b in destination.buckets if self._mine(b.name)]
                destination.wake.set()
        for partition in sorted(self._leaving):
            mine = [
                bucket
                for name, bucket in self._buckets.items()
                if partition_of(name, self.partitions) == partition
            ]
            if any(bucket.taken for bucket in mine):
                continue  # in flight: released once their outcomes are recorded
            for bucket in mine:
                del self._buckets[bucket.name]
            await self._db(self.jobdb.release_partition, partition)
            self._held.discard(partition)
            self._leaving.discard(partition)
            self.report(f"released partition {partition} ({live} directors, {share} each)")
        if len(self._held) < share:
            for partition in probe_order(self.partitions, random.randrange(self.partitions)):
                if len(self._held) >= share:
                    break
                if partition in self._held:
                    continue
                if await self._db(self.jobdb.take_partition, partition):
                    await self._db(self._took, partition)
                    self.report(f"took partition {partition} ({live} directors, {share} each)")
        self._portions()

    def _portions(self) -> None:
        """Each destination's ``rate``, ``burst`` and ``max_in_flight`` for this director:
        the destination's limit × the share of the partitions holding its buckets that this
        director keeps (:func:`~exactly.delivery.partitions.portion`)."""
        if self.partitions <= 1:
            return
        spreads: dict[str, set[int]] = {}
        for name in self._all_buckets:
            spreads.setdefault(name.rpartition("/")[2], set()).add(
                partition_of(name, self.partitions)
            )
        mine = self._held - self._leaving
        for name, destination in self._destinations.items():
            configured = self.destinations[name]
            spread = spreads.get(name, set())
            in_flight = portion(configured.max_in_flight, mine, spread)
            if destination.settings.max_in_flight != in_flight:
                destination.settings = configured.model_copy(update={"max_in_flight": in_flight})
            destination.pace.rate = rate_portion(configured.rate, mine, spread)
            destination.pace.burst = portion(configured.burst, mine, spread)

    async def _db(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the JobDB from its thread; a failure is retried (new connection, the director
        lock checked, ``exactly.backoff`` between tries) for ``jobdb_patience`` seconds, then
        raised as one JobDBError naming the JobDB and the cause."""
        loop = asyncio.get_running_loop()
        patience = Patience(
            self.jobdb.describe(),
            self.jobdb_patience,
            "the director stopped, and a restart resumes from what the JobDB holds",
            self.report,
        )
        while True:
            try:
                if patience.attempt:
                    await loop.run_in_executor(self._executor, self.jobdb.keep_partitions)
                return await loop.run_in_executor(
                    self._executor, partial(function, *args, **kwargs)
                )
            except ExactlyError:  # decided (a lock held by another, an archive refusing)
                raise
            except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
                try:
                    pause = patience.failed(error, spent=self._jobdb_failed)
                except JobDBError:
                    self._jobdb_failed = True
                    raise
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._executor, self.jobdb.close)
                await asyncio.sleep(pause)

    def stop(self) -> None:
        """Ask a director running in another thread to stop, as SIGTERM does."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def deliver(self, *, until_drained: bool = False) -> None:
        """Deliver until stopped (or, with ``until_drained``, until nothing is pending)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        for number in (signal.SIGTERM, signal.SIGINT):
            # ValueError: uvloop, not on the main thread (tests run the director in a thread)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(number, self._stop.set)
        self._writer = _Writer(self._db, self.jobdb)
        writer = asyncio.create_task(self._writer.run())
        tasks: list[asyncio.Task[None]] = []
        try:
            while not self._stop.is_set():
                if time.time() - self._leased_at >= self.lease_seconds:
                    await self._lease()
                self._all_buckets = await self._db(self.jobdb.buckets)
                for name in self._all_buckets:
                    if not self._mine(name):
                        continue
                    if name not in self._buckets and name not in self._removed:
                        destination = self._open_bucket(name)
                        if destination is not None:
                            tasks.append(asyncio.create_task(self._schedule(destination)))
                if self._removed:
                    await self._expire_removed()
                if (
                    self.archive is not None
                    and 0 in self._held  # partition 0's holder archives
                    and time.time() - self._archived_at > self.archive_seconds
                ):
                    self._start_archiving()
                if time.time() - self._lock_checked_at >= 1.0:
                    self._lock_checked_at = time.time()
                    await self._apply_controls()
                if self.metrics is not None and time.time() - self._measured_at >= 1.0:
                    await self._measure(self.metrics)
                if until_drained and await self._drained():
                    if self.archive is not None and 0 in self._held:
                        if self._archiving is not None:
                            await self._archiving
                        await self._archive()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0 if not until_drained else 0.2)
                for task in tasks:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            if self._failure is not None:
                raise self._failure
        finally:
            self._stop.set()
            for destination in self._destinations.values():
                destination.wake.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._archiving is not None:
                await asyncio.gather(self._archiving, return_exceptions=True)
            await self._finish_sends()
            self._writer.close()
            await writer
            for destination in self._destinations.values():
                await destination.session.close()

    def _sent(self, task: asyncio.Task[None]) -> None:
        """A failed send (the JobDB refused a write) stops the director: the jobs it held are
        no longer in memory, and the next start reads them from the JobDB again."""
        self._sends.discard(task)
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()
            assert self._stop is not None
            self._stop.set()

    def _start_archiving(self) -> None:
        """Start an archive pass in the background unless one runs (a failed one raises)."""
        if self._archiving is not None and not self._archiving.done():
            return
        if self._archiving is not None and self._archiving.exception() is not None:
            raise self._archiving.exception()  # type: ignore[misc]
        self._archived_at = time.time()
        self._archiving = asyncio.create_task(self._archive())

    async def _archive(self) -> None:
        """Archive every dataset whose jobs are all finished (not the newest), then drop it.

        ``JobDB.archive``'s steps 1 to 3 (mark, write the file, mark) run in a thread of their
        own on a second connection, so no request waits while a file is written; step 4, the
        drop, runs in line with the director's other JobDB calls, so none of them reads a
        dataset while it is dropped. A failing archive or second connection is reported and
        tried again at the next pass; delivery goes on.
        """
        assert self.archive is not None
        archive = self.archive
        self._archived_at = time.time()
        loop = asyncio.get_running_loop()
        if self._archive_db is None:
            from exactly.delivery.jobdb import open_jobdb

            self._archive_db = open_jobdb(self.jobdb.url)
        aside = self._archive_db

        async def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
            return await loop.run_in_executor(self._archiver, partial(function, *args, **kwargs))

        try:
            datasets = {dataset.number: dataset for dataset in await call(aside.datasets)}
            ready = await call(aside.archivable)
        except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
            self.report(f"archiving waits: the JobDB failed ({error}); tried again in a while")
            with contextlib.suppress(Exception):
                await call(aside.close)
            return
        for number in ready:
            name = archive_name(datasets[number])

            def write(records: Iterator[dict[str, Any]], name: str = name) -> None:
                archive.write(name, records)

            try:
                await call(aside.archive, number, write, drop=False)  # 1. to 3., aside
            except Exception as error:  # noqa: BLE001 (the archive's or the driver's)
                self.report(f"dataset {number} not archived, tried again in a while: {error}")
                with contextlib.suppress(Exception):
                    await call(aside.close)
                return
            await self._db(self.jobdb.archive, number, write)  # 4. the drop, in line
            self.archived += 1
            self.report(f"dataset {number} archived to {archive.location(name)} and dropped")

    async def _measure(self, metrics: DeliveryMetrics) -> None:
        """Refresh the metrics' gauges from memory; every 5 s, count what is not paged in."""
        now = time.time()
        if now - self._unpaged_at >= 5.0:  # (timed apart from _measured_at, set every call)
            self._unpaged_at = now
            metrics.datasets = len(await self._db(self.jobdb.datasets))
            for name, bucket in self._buckets.items():
                self._unpaged[name] = (
                    0
                    if bucket.caught_up
                    else await self._db(self.jobdb.unpaged, name, after=bucket.cursor)
                )
        self._measured_at = now
        figures: dict[str, list[float]] = {}
        for destination in self._destinations.values():
            entry = figures.setdefault(destination.name, [0, 0, 0, now])
            for bucket in destination.buckets:
                waiting = sum(
                    1 for job in bucket.ready if job.retry_at is not None and job.retry_at > now
                )
                unpaged = 0 if bucket.caught_up else self._unpaged.get(bucket.name, 0)
                entry[0] += len(bucket.ready) - waiting + unpaged  # paged since: not counted
                entry[1] += bucket.taken
                entry[2] += len(bucket.retries) + waiting
                held = [job.created_at for job in bucket.ready]
                held += [job.created_at for _, _, job in bucket.retries]
                entry[3] = min([entry[3], *held])
        metrics.gauges = {
            name: Gauges(int(queued), int(in_flight), int(retrying), max(0.0, now - oldest))
            for name, (queued, in_flight, retrying, oldest) in figures.items()
        }

    async def _finish_sends(self) -> None:
        """Let the jobs recorded ``executing`` go out (a batch being recorded starts senders
        when its commit returns), for at most the longest timeout and a second."""
        loop = asyncio.get_running_loop()
        longest = max(destination.timeout for destination in self.destinations.values())
        deadline = loop.time() + longest + 1
        while self._sends:
            _, late = await asyncio.wait(set(self._sends), timeout=deadline - loop.time())
            if late and loop.time() >= deadline:
                for task in late:  # left executing: resent on the next start
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
                return

    async def _drained(self) -> bool:
        """Whether nothing is pending in the buckets of this director's partitions."""
        if not all(b.idle for d in self._destinations.values() for b in d.buckets):
            return False
        for name in self._buckets:
            if await self._db(self.jobdb.pending, name, limit=1):
                return False
        known = set(self._buckets) | self._removed
        return all(name in known for name in await self._db(self.jobdb.buckets) if self._mine(name))

    def _open_bucket(self, name: str) -> Destination | None:
        """Add a new bucket to its destination; the destination when it is new too (its
        scheduler is then to be started), else None. A bucket whose destination is no longer
        configured is set aside: its jobs are expired (:meth:`_expire_removed`)."""
        settings = self.destinations.get(name.rpartition("/")[2])
        if settings is None:
            self._removed.add(name)
            self.report(
                f"bucket {name}: its destination is not in [[destinations]] any more; "
                f"its jobs are expired ({REMOVED})"
            )
            return None
        destination = self._destinations.get(settings.name)
        fresh = destination is None
        if destination is None:
            pace = Pace(
                rate=settings.rate,
                burst=settings.burst,
                open_after=settings.breaker.open_after or None,
                failing_for=settings.breaker.failing_for,
                probe_minimum=settings.backoff.minimum,
                probe_maximum=settings.backoff.maximum,
                jitter=self.jitter or random.random,
            )
            destination = Destination(
                settings,
                pace,
                session=_session(settings),
                keys=settings.signing_keys(),
                headers={**settings.headers, DIRECTOR_HEADER: self.tag},
            )
            self._destinations[settings.name] = destination
        bucket = Bucket(name, ordered=settings.ordered)
        destination.buckets.append(bucket)
        self._buckets[name] = bucket
        destination.wake.set()
        return destination if fresh else None

    async def _expire_removed(self) -> None:
        """Expire the pending jobs of buckets whose destination was removed from the config
        (RudderStack drops them too): archived like any other, and replayable from there."""
        for name in sorted(self._removed):
            if not self._mine(name):
                continue
            jobs = await self._db(self.jobdb.pending, name, limit=self.page_size)
            if not jobs:
                continue
            now = time.time()
            await self._writer_of().record(
                [
                    Transition(job.id, EXPIRED, job.attempt, time=now, error_type=REMOVED)
                    for job in jobs
                ]
            )
            self.report(f"bucket {name}: {len(jobs)} jobs expired ({REMOVED})")

    async def _apply_controls(self) -> None:
        """Apply what operators set (a pause, an expiry asked for: answered for the partitions
        this director keeps) and report each breaker. The breaker is this director's own:
        its row is written when this director's breaker changes, so it shows the last change
        any director made."""
        controls = await self._db(self.jobdb.controls)
        mine = self._held - self._leaving
        for name, destination in self._destinations.items():
            control = controls.get(name, Control(name))
            if destination.pace.held != control.held:
                destination.pace.held = control.held
                self.report(f"{name}: {'paused' if control.held else 'resumed'} by an operator")
                destination.wake.set()
            unanswered = mine - set(control.expired_partitions)
            if control.expire_asked is not None and unanswered:
                before = control.expire_before or control.expire_asked
                count = await self._expire_before(destination, before, unanswered)
                await self._db(
                    self.jobdb.answer_expiry, name, control.expire_asked, unanswered, count
                )
                self.report(f"{name}: {count} jobs expired by an operator")
            pace = destination.pace
            since = pace.failing_since if pace.open else None
            last = self._breakers.get(name, (control.breaker_open, control.failing_since))
            if last != (pace.open, since):
                await self._db(
                    self.jobdb.set_control, name, breaker_open=pace.open, failing_since=since
                )
                if pace.open:
                    self.report(f"{name}: paused after {pace.failures} failed requests; probing")
                elif last[0]:
                    self.report(f"{name}: answering again; sending resumed")
            self._breakers[name] = (pace.open, since)
        for name, control in controls.items():  # asked of a destination with no jobs here
            unanswered = mine - set(control.expired_partitions)
            if control.expire_asked is not None and unanswered and name not in self._destinations:
                await self._db(self.jobdb.answer_expiry, name, control.expire_asked, unanswered, 0)

    async def _expire_before(
        self, destination: Destination, before: float, partitions: set[int]
    ) -> int:
        """Expire the destination's pending jobs created before ``before`` in ``partitions``
        (an operator's ask): those held in memory, those recorded but not sent, and those not
        yet paged in; only jobs whose request is out finish as they would."""
        gone: list[Job] = []
        for bucket in destination.buckets:
            if partition_of(bucket.name, self.partitions) not in partitions:
                continue
            gone += bucket.drop(lambda job: job.created_at < before)
            after = bucket.cursor
            while True:
                page = await self._db(
                    self.jobdb.pending, bucket.name, after=after, limit=self.page_size
                )
                gone += [job for job in page if job.created_at < before]
                if len(page) < self.page_size:
                    break
                after = page[-1].id
        unsent = [
            (bucket, job)
            for bucket, job in destination.outbox
            if isinstance(job, Job)
            and job.created_at < before
            and partition_of(bucket.name, self.partitions) in partitions
        ]  # recorded executing, not sent: ended with the attempt they were given (a batch
        # recorded for an attempt goes out and ends as it would)
        if unsent:
            gone_ids = {job.id for _, job in unsent}
            destination.outbox = deque(
                entry
                for entry in destination.outbox
                if not (isinstance(entry[1], Job) and entry[1].id in gone_ids)
            )
        now = time.time()
        steps = [
            Transition(job.id, EXPIRED, job.attempt, time=now, error_type=BY_OPERATOR)
            for job in gone
        ]
        steps += [
            Transition(job.id, EXPIRED, job.attempt + 1, time=now, error_type=BY_OPERATOR)
            for _, job in unsent
        ]
        try:
            if steps:
                await self._writer_of().record(steps)
        finally:
            for bucket, job in unsent:
                destination.done(bucket, job)
        self.tallies[destination.name].expired += len(steps)
        return len(steps)

    def _writer_of(self) -> _Writer:
        assert self._writer is not None
        return self._writer

    # -- one destination -----------------------------------------------------------------------

    async def _schedule(self, destination: Destination) -> None:
        """Page each bucket in, take jobs in turn within the destination's reserve, record
        them ``executing`` and hand them to the senders."""
        assert self._stop is not None
        while not self._stop.is_set():
            now = time.time()
            waits = [self.poll_seconds]
            for bucket in list(destination.buckets):
                room = self.page_size - bucket.held
                # page in runs of at least REFILL jobs (or when nothing is ready): a page per
                # answered job would keep the JobDB's thread busy with small queries, and the
                # outcomes' commits, which free the slots, would wait behind them
                refill = room >= min(self.page_size, REFILL) or (room > 0 and not bucket.ready)
                if destination.settings.batching and not bucket.loaded:
                    await self._load_batches(destination, bucket, now)
                if refill and (not bucket.caught_up or now - bucket.paged_at >= self.poll_seconds):
                    await self._page(bucket, room, now)
                bucket.due(now)
                if not bucket.caught_up:
                    waits.append(0.05)
                if bucket.retries:
                    waits.append(bucket.retries[0][0] - now)
            if destination.settings.batching:
                items, held_back = destination.form(now)
                if items:
                    task = asyncio.create_task(self._attempt_batches(destination, items))
                    self._sends.add(task)
                    task.add_done_callback(self._sent)
                    waits.append(0.0 if destination.batches_out < destination.reserve else 1.0)
                if held_back is not None:
                    waits.append(held_back)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(destination.wake.wait(), max(0.0, min(waits)))
                destination.wake.clear()
                continue
            batch, held_back = destination.take(now)
            if batch:
                task = asyncio.create_task(self._attempt(destination, batch))
                self._sends.add(task)
                task.add_done_callback(self._sent)
                if destination.taken < destination.reserve:
                    waits.append(0.0)
            if held_back is not None:
                waits.append(held_back)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(destination.wake.wait(), max(0.0, min(waits)))
            destination.wake.clear()

    async def _page(self, bucket: Bucket, room: int, now: float) -> None:
        jobs = await self._pending(bucket.name, after=bucket.cursor, limit=room)
        bucket.paged_at = now
        bucket.caught_up = len(jobs) < room
        bucket.place(jobs, now)

    async def _pending(self, bucket: str, *, after: int, limit: int) -> list[Job]:
        """A page of ``bucket``'s pending jobs, read on a second connection in a thread of its
        own: paging (a row and a job object per job) then runs beside the commits of
        transitions instead of between them, and neither waits for the other. The page holds
        only ids above the bucket's cursor, which no write of this director has touched yet
        (open batches' members are set aside when loaded), so a read beside a write sees them
        as the director's own connection would. A failing read (or a JobDB that cannot be
        opened twice) falls back to the director's connection, its retries and patience."""
        loop = asyncio.get_running_loop()
        try:
            if self._paging_db is None:  # the same class on the same URL: its own connection
                self._paging_db = type(self.jobdb)(self.jobdb.url)  # type: ignore[call-arg]
            reader = self._paging_db
            return await loop.run_in_executor(
                self._paging, partial(reader.pending, bucket, after=after, limit=limit)
            )
        except Exception:  # noqa: BLE001 (each driver has its own error tree)
            if self._paging_db is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._paging, self._paging_db.close)
                self._paging_db = None
            return await self._db(self.jobdb.pending, bucket, after=after, limit=limit)

    async def _load_batches(self, destination: Destination, bucket: Bucket, now: float) -> None:
        """The batches a previous run left open (in flight at a crash, or waiting to retry):
        sent again whole, under their ids, before anything new; their members are never paged
        in as jobs of their own."""
        for found in await self._db(self.jobdb.open_batches, bucket.name):
            jobs = [  # a member's attempts before the batch (an `executing` row: older JobDBs)
                dataclasses.replace(job, attempt=max(0, job.attempt - 1))
                if job.state == EXECUTING
                else job
                for job in found.jobs
            ]
            if not jobs:
                continue
            attempt = found.attempt if found.state == AWAITING_RETRY else found.attempt - 1
            held = HeldBatch(found.batch, bucket, jobs, attempt, found.retry_at)
            bucket.in_batches.update(job.id for job in jobs if job.id > bucket.cursor)
            bucket.taken += len(jobs)
            if bucket.ordered:
                bucket.users_out.update(job.user_id or "" for job in jobs)
            due = found.retry_at if found.state == AWAITING_RETRY and found.retry_at else now
            heapq.heappush(bucket.batches, (due, jobs[0].id, held))
        bucket.loaded = True

    async def _attempt_batches(
        self, destination: Destination, items: list[HeldBatch | tuple[Bucket, list[Job]]]
    ) -> None:
        """Step 1 for batches: a new batch is formed (its id from its members) and recorded
        with its first step (its members get no row of their own until it ends: the batch's row
        lists them); a batch sent again gets a step of its own; both committed before the
        request leaves. Jobs or batches past their expiry are expired unsent instead."""
        now = time.time()
        name = destination.name
        transitions: list[Transition] = []
        groups: list[Members] = []
        formed: list[Batch] = []
        steps: list[BatchStep] = []
        ready: list[HeldBatch] = []
        ended: list[HeldBatch] = []
        for item in items:
            if isinstance(item, HeldBatch):
                if _expired_batch(item, now):
                    groups += _ends(item, EXPIRED, item.attempt, now)
                    steps.append(BatchStep(item.id, EXPIRED, item.attempt, time=now))
                    ended.append(item)
                    continue
                steps.append(BatchStep(item.id, EXECUTING, item.attempt + 1, time=now))
                ready.append(item)
                continue
            bucket, jobs = item
            live = [job for job in jobs if not _expired(job, now)]
            gone = [job for job in jobs if _expired(job, now)]
            transitions += [Transition(job.id, EXPIRED, job.attempt, time=now) for job in gone]
            if not live:
                ended.append(HeldBatch(Batch("", bucket.name, name, ()), bucket, gone))
                continue
            if gone:
                bucket.taken -= len(gone)
                if bucket.ordered:
                    bucket.users_out.difference_update(job.user_id or "" for job in gone)
            members = tuple(job.id for job in live)
            formed_batch = Batch(
                batch_id(name, [(job.id, job.message_id) for job in live]),
                bucket.name,
                name,
                members,
                created_at=now,
            )
            formed.append(formed_batch)
            steps.append(BatchStep(formed_batch.id, EXECUTING, 1, time=now))
            ready.append(HeldBatch(formed_batch, bucket, live))
        tally = self.tallies[name]
        try:
            await self._writer_of().record(
                transitions, batches=formed, steps=steps, members=groups
            )  # 1.
        except BaseException:
            for held in [*ready, *ended]:
                destination.batch_done(held, ended=True)
            raise
        tally.expired += len(transitions)  # jobs expired before a batch took them
        tally.expired += sum(len(group.job_ids) for group in groups if group.state == EXPIRED)
        for held in ended:
            destination.batch_done(held, ended=True)
        destination.outbox.extend((held.bucket, held) for held in ready)
        room = destination.settings.max_in_flight - destination.senders
        for _ in range(min(len(destination.outbox), room)):
            destination.senders += 1
            sender = asyncio.create_task(self._sender(destination))
            self._sends.add(sender)
            sender.add_done_callback(self._sent)

    async def _attempt(self, destination: Destination, batch: list[tuple[Bucket, Job]]) -> None:
        """Step 1 of the module docstring for jobs taken together, then on to the senders."""
        writer = self._writer_of()
        now = time.time()
        tally = self.tallies[destination.name]
        live = [(bucket, job) for bucket, job in batch if not _expired(job, now)]
        gone = [(bucket, job) for bucket, job in batch if _expired(job, now)]
        steps = [Transition(job.id, EXPIRED, job.attempt, time=now) for _, job in gone]
        steps += [Transition(job.id, EXECUTING, job.attempt + 1, time=now) for _, job in live]
        try:
            await writer.record(steps)  # 1. executing, durable before any request leaves
        except BaseException:
            for bucket, job in batch:
                destination.done(bucket, job)
            raise
        tally.expired += len(gone)
        for bucket, job in gone:
            destination.done(bucket, job)
        destination.outbox.extend(live)
        room = destination.settings.max_in_flight - destination.senders
        for _ in range(min(len(destination.outbox), room)):
            destination.senders += 1
            sender = asyncio.create_task(self._sender(destination))
            self._sends.add(sender)
            sender.add_done_callback(self._sent)

    async def _sender(self, destination: Destination) -> None:
        """Steps 2 and 3 for the destination's recorded jobs, one at a time, while there are
        any, each when its pacing lets it leave.

        A sender holds its job until the outcome is durable, and a destination has at most
        ``max_in_flight`` senders, so its requests out, and the jobs sent but not yet recorded
        (the duplicate window), never exceed ``max_in_flight``. The request's timeout starts
        when it leaves: a job waiting for its turn is never counted as an unanswered request.
        """
        assert self._stop is not None
        try:
            while destination.outbox and not self._stop.is_set():
                bucket, job = destination.outbox[0]
                if not self._mine(bucket.name):  # its partition is being given up: not sent
                    destination.outbox.popleft()
                    if isinstance(job, HeldBatch):
                        destination.batch_done(job, ended=True)
                    else:
                        destination.done(bucket, job)
                    continue
                if time.time() > job.expire_at + LAST_TRY:  # held past its expiry (a breaker)
                    destination.outbox.popleft()
                    if isinstance(job, HeldBatch):
                        await self._expire_unsent_batch(destination, job)
                    else:
                        await self._expire_unsent(destination, bucket, job)
                    continue
                wait = destination.pace.take(time.time())
                if wait > 0:  # left recorded and unsent if stopped meanwhile: not a duplicate
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), min(wait, 1.0))
                    continue
                destination.outbox.popleft()  # no await since the peek: still this job
                if isinstance(job, HeldBatch):
                    await self._send_batch(destination, job)
                else:
                    await self._send_now(destination, bucket, job)
        finally:
            destination.senders -= 1

    async def _expire_unsent(self, destination: Destination, bucket: Bucket, job: Job) -> None:
        """A job recorded ``executing`` that could not leave before its expiry: expired unsent."""
        step = Transition(
            job.id, EXPIRED, job.attempt + 1, time=time.time(), error_type="not sent in time"
        )
        try:
            await self._writer_of().record([step])
        finally:
            destination.done(bucket, job)
        self.tallies[destination.name].expired += 1

    async def _send_now(self, destination: Destination, bucket: Bucket, job: Job) -> None:
        writer = self._writer_of()
        settings = destination.settings
        tally = self.tallies[destination.name]
        attempt = job.attempt + 1
        tally.sent += 1
        status, error_type, response, wait = await self._post(  # 2. the request
            destination, job.message_id, lambda: job.payload
        )
        now = time.time()
        destination.pace.answered(result_of(status, retry_after=wait), now, wait=wait)
        step = next_step(
            job_id=job.id,
            attempt=attempt,
            expire_at=job.expire_at,
            now=now,
            status=status,
            error_type=error_type,
            response=response,
            retry_after_seconds=wait,
            max_attempts=settings.retry.max_attempts,
            minimum=settings.backoff.minimum,
            maximum=settings.backoff.maximum,
            coefficient=settings.backoff.coefficient,
            jitter=self.jitter,
        )
        try:
            await writer.record([step])  # 3. the outcome
        finally:
            destination.done(bucket, job)
        if step.state == SUCCEEDED:
            tally.succeeded += 1
            return
        tally.last_error = f"{status or error_type}: {(response or '')[:200]}"
        if step.state == AWAITING_RETRY:
            tally.retried += 1
            bucket.again(
                dataclasses.replace(
                    job, state=AWAITING_RETRY, attempt=attempt, retry_at=step.retry_at
                )
            )
        elif step.state == DISCARDED:
            tally.discarded += 1
        elif step.state == EXPIRED:
            tally.expired += 1

    async def _post(
        self,
        destination: Destination,
        key: str,
        make_body: Callable[[], bytes],
        content_type: str = "application/json",
    ) -> tuple[int | None, str | None, str | None, float | None]:
        """One request with ``key`` as its Idempotency-Key / webhook-id, signed; its status,
        error type, response start (when not 2xx) and the wait a Retry-After asks for. Any
        failure while the request is built or sent is its error, never raised."""
        settings = destination.settings
        status: int | None = None
        error_type: str | None = None
        response: str | None = None
        wait: float | None = None
        started = time.monotonic()
        try:
            data = make_body()
            headers = request_headers(
                message_id=key,
                body=data,
                timestamp=int(time.time()),
                keys=destination.keys,
                extra=destination.headers,
                content_type=content_type,
            )
            async with asyncio.timeout(settings.timeout):
                async with destination.session.post(
                    settings.url, data=data, headers=headers, allow_redirects=False
                ) as answer:
                    status = answer.status
                    text = await answer.content.read(MAX_RESPONSE)
                    if not 200 <= status < 300:
                        response = text.decode("utf-8", "replace")
                        wait = retry_after(answer.headers.get("Retry-After"), time.time())
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 (any failure of one request is the job's)
            status = None
            error_type, response = failure(error, timeout=settings.timeout, url=settings.url)
        if self.metrics is not None:
            self.metrics.latency.labels(destination.name).observe(time.monotonic() - started)
        return status, error_type, response, wait

    async def _send_batch(self, destination: Destination, held: HeldBatch) -> None:
        """Steps 2 and 3 for a batch: the request (its body rebuilt from its members in their
        order; ``sentAt`` is this attempt's), then the outcome: a batch step, and when the batch
        ends, each member's terminal transition in the same commit."""
        settings = destination.settings
        form = settings.batch.format
        tally = self.tallies[destination.name]
        attempt = held.attempt + 1
        payloads = [job.payload for job in held.jobs]
        tally.sent += 1
        status, error_type, response, wait = await self._post(  # 2. the request
            destination, held.id, lambda: body(form, payloads, time.time()), CONTENT_TYPES[form]
        )
        now = time.time()
        destination.pace.answered(result_of(status, retry_after=wait), now, wait=wait)
        outcome = next_step(
            job_id=0,
            attempt=attempt,
            expire_at=held.expire_at,
            now=now,
            status=status,
            error_type=error_type,
            response=response,
            retry_after_seconds=wait,
            max_attempts=settings.retry.max_attempts,
            minimum=settings.backoff.minimum,
            maximum=settings.backoff.maximum,
            coefficient=settings.backoff.coefficient,
            jitter=self.jitter,
        )
        step = BatchStep(
            held.id,
            outcome.state,
            attempt,
            time=now,
            retry_at=outcome.retry_at,
            status_code=status,
            error_type=error_type,
            response=outcome.response,
        )
        ended = outcome.state != AWAITING_RETRY
        groups = _ends(held, outcome.state, attempt, now, outcome) if ended else []
        try:
            await self._writer_of().record((), steps=[step], members=groups)  # 3. the outcome
        finally:
            destination.batch_done(held, ended=ended)
        count = len(held.jobs)
        if outcome.state == SUCCEEDED:
            tally.succeeded += count
            return
        tally.last_error = f"{status or error_type}: {(response or '')[:200]}"
        if outcome.state == AWAITING_RETRY:
            tally.retried += count
            held.attempt, held.retry_at = attempt, outcome.retry_at
            heapq.heappush(held.bucket.batches, (outcome.retry_at or now, held.jobs[0].id, held))
        elif outcome.state == DISCARDED:
            tally.discarded += count
        elif outcome.state == EXPIRED:
            tally.expired += count

    async def _expire_unsent_batch(self, destination: Destination, held: HeldBatch) -> None:
        """A batch recorded for an attempt that could not leave before its expiry."""
        now = time.time()
        step = BatchStep(
            held.id, EXPIRED, held.attempt + 1, time=now, error_type="not sent in time"
        )
        try:
            await self._writer_of().record(
                (), steps=[step], members=_ends(held, EXPIRED, held.attempt + 1, now)
            )
        finally:
            destination.batch_done(held, ended=True)
        self.tallies[destination.name].expired += len(held.jobs)


def _ends(
    held: HeldBatch, state: str, attempt: int, now: float, outcome: Transition | None = None
) -> list[Members]:
    """Each member's transition when its batch ends in ``state`` after ``attempt`` tries of
    the batch (a member's attempts count the tries it had before the batch too)."""
    if outcome is None:
        return _members(held.jobs, state, max(attempt, 1), now)
    return _members(
        held.jobs,
        state,
        max(attempt, 1),
        now,
        status_code=outcome.status_code,
        error_type=outcome.error_type,
        response=outcome.response,
    )


def _members(
    jobs: Sequence[Job], state: str, tries: int, now: float, **outcome: Any
) -> list[Members]:
    """``state`` for each of ``jobs`` at its own attempt (the tries it had before, plus
    ``tries``), as one :class:`Members` per attempt number: usually one for a whole batch."""
    by_attempt: dict[int, list[int]] = {}
    for job in jobs:
        by_attempt.setdefault(job.attempt, []).append(job.id)
    return [
        Members(tuple(ids), state, before + tries, time=now, **outcome)
        for before, ids in by_attempt.items()
    ]


def _expired_batch(held: HeldBatch, now: float) -> bool:
    """Whether a batch's time is up before its next try (its first member's expiry), unless
    the retry was set at the expiry: its last try."""
    expire_at = held.expire_at
    if expire_at > now:
        return False
    return not (held.retry_at is not None and held.retry_at >= expire_at)


REMOVED = "destination removed"
DIRECTOR_HEADER = "X-Exactly-Director"  # which director sent a request: its pid and a nonce
PARTITIONS_HELD = (
    "stop another director first, let this one wait for a free partition (without "
    "--no-wait), or raise [delivery] partitions to run more directors"
)

LAST_TRY = 5.0  # seconds past its expiry a job's last try may still leave


def _expired(job: Job, now: float) -> bool:
    """Whether a job's time is up before its next try. A retry set at its expiry (the last
    try a long ``Retry-After`` or backoff leaves it) is still made."""
    if job.expire_at > now:
        return False
    return not (job.retry_at is not None and job.retry_at >= job.expire_at)


def _session(settings: DestinationSettings) -> aiohttp.ClientSession:
    """A destination's HTTP session: no pool limit of its own (its senders bound the
    connections to ``max_in_flight``), so a request never waits for a connection, and no
    timeout of its own (the sender times the request from when it leaves)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
        headers={"User-Agent": "exactly-delivery"},
    )
