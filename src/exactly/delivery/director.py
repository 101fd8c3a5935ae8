"""The director: the one process that sends the JobDB's jobs to their destinations.

It holds the JobDB's director lock for as long as it runs (a standby waits on it), so it is the
only writer of job transitions. Each bucket (source × destination) is scheduled from memory with
its own queue, concurrency (``max_in_flight``), rate limit (GCRA) and connection pool, so a slow or
failing destination only grows its own queue. Jobs are paged in per bucket (at most ``page_size``
held per bucket, in flight and waiting to retry included), so memory stays bounded with millions
queued.

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
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import aiohttp
import uvloop

from exactly.delivery.archive import Archive, archive_name
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXECUTING,
    EXPIRED,
    MAX_RESPONSE,
    SUCCEEDED,
    Job,
    JobDB,
    JobDBError,
    Transition,
)
from exactly.delivery.metrics import DeliveryMetrics, Gauges
from exactly.delivery.patience import Patience
from exactly.delivery.policy import next_step, retry_after
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.signing import request_headers
from exactly.errors import ExactlyError
from exactly.gcra import Rate, shape

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


class _Writer:
    """Group commit of transitions: callers wait until their transitions are durable."""

    def __init__(self, call: Callable[..., Any], jobdb: JobDB) -> None:
        self._call = call
        self._jobdb = jobdb
        self._waiting: list[tuple[Sequence[Transition], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._closing = False

    async def record(self, transitions: Sequence[Transition]) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((transitions, future))
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
            steps = [step for transitions, _ in batch for step in transitions]
            try:
                await self._call(self._jobdb.record, steps)
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


@dataclass
class _Bucket:
    name: str
    destination: DestinationSettings
    session: aiohttp.ClientSession
    ready: deque[Job] = field(default_factory=deque)
    retries: list[tuple[float, int, Job]] = field(default_factory=list)
    in_flight: int = 0
    cursor: int = 0
    caught_up: bool = False
    paged_at: float = 0.0
    tat: float = 0.0
    users_in_flight: set[str] = field(default_factory=set)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outbox: deque[Job] = field(default_factory=deque)  # recorded executing, not yet sent
    senders: int = 0

    @property
    def reserve(self) -> int:
        """Jobs taken at once: twice ``max_in_flight`` unless rate-limited or ordered, so the next
        jobs' ``executing`` commit while the current requests are out (a job recorded but not
        yet sent cannot be a duplicate); at most ``max_in_flight`` senders bound the requests."""
        destination = self.destination
        if destination.rate is not None or destination.ordered:
            return destination.max_in_flight
        return 2 * destination.max_in_flight

    @property
    def held(self) -> int:
        return len(self.ready) + len(self.retries) + self.in_flight

    @property
    def idle(self) -> bool:
        return self.held == 0 and self.caught_up


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
    ) -> None:
        self.jobdb = jobdb
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
        self._buckets: dict[str, _Bucket] = {}
        self._unknown: set[str] = set()
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._stop: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="jobdb")
        self._archiver = ThreadPoolExecutor(1, thread_name_prefix="archive")
        self._archiving: asyncio.Task[None] | None = None
        self._archive_db: JobDB | None = None
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
        if not wait:
            self.report(f"taking the director lock of {self.jobdb.describe()}")
        else:
            self.report(f"waiting for the director lock of {self.jobdb.describe()}")
        with self.jobdb.director_lock(wait=wait):
            self.report("holding the director lock; delivering")
            for number in self.jobdb.drop_orphans():  # tables a crash left unlisted
                self.report(f"dropped the tables of dataset {number}, which no dataset lists")
            try:
                uvloop.run(self.deliver(until_drained=until_drained))
            finally:
                self._executor.shutdown(wait=True)
                self._archiver.shutdown(wait=True)
                if self._archive_db is not None:
                    self._archive_db.close()
        return self.tallies

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
                    await loop.run_in_executor(self._executor, self.jobdb.keep_lock)
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

    async def deliver(self, *, until_drained: bool = False) -> None:
        """Deliver until stopped (or, with ``until_drained``, until nothing is pending)."""
        loop = asyncio.get_running_loop()
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
                for name in await self._db(self.jobdb.buckets):
                    if name not in self._buckets and name not in self._unknown:
                        bucket = self._open_bucket(name)
                        if bucket is not None:
                            tasks.append(asyncio.create_task(self._schedule(bucket)))
                if (
                    self.archive is not None
                    and time.time() - self._archived_at > self.archive_seconds
                ):
                    self._start_archiving()
                if time.time() - self._lock_checked_at >= 1.0:
                    self._lock_checked_at = time.time()
                    await self._db(self.jobdb.keep_lock)
                if self.metrics is not None and time.time() - self._measured_at >= 1.0:
                    await self._measure(self.metrics)
                if until_drained and await self._drained():
                    if self.archive is not None:
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
            for bucket in self._buckets.values():
                bucket.wake.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._archiving is not None:
                await asyncio.gather(self._archiving, return_exceptions=True)
            await self._finish_sends()
            self._writer.close()
            await writer
            for session in self._sessions.values():
                await session.close()

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
        if now - self._measured_at >= 5.0 or not self._unpaged:
            metrics.datasets = len(await self._db(self.jobdb.datasets))
            for name, bucket in self._buckets.items():
                self._unpaged[name] = (
                    0
                    if bucket.caught_up
                    else await self._db(self.jobdb.unpaged, name, after=bucket.cursor)
                )
        self._measured_at = now
        figures: dict[str, list[float]] = {}
        for name, bucket in self._buckets.items():
            entry = figures.setdefault(bucket.destination.name, [0, 0, 0, now])
            waiting = sum(
                1 for job in bucket.ready if job.retry_at is not None and job.retry_at > now
            )
            entry[0] += len(bucket.ready) - waiting + self._unpaged.get(name, 0)
            entry[1] += bucket.in_flight
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
        if not all(bucket.idle for bucket in self._buckets.values()):
            return False
        for name in self._buckets:
            if await self._db(self.jobdb.pending, name, limit=1):
                return False
        known = set(self._buckets) | self._unknown
        return all(name in known for name in await self._db(self.jobdb.buckets))

    def _open_bucket(self, name: str) -> _Bucket | None:
        destination = self.destinations.get(name.rpartition("/")[2])
        if destination is None:
            self._unknown.add(name)
            self.report(f"bucket {name}: no such destination in [[destinations]]; its jobs wait")
            return None
        session = self._sessions.get(destination.name)
        if session is None:
            connector = aiohttp.TCPConnector(
                limit=destination.max_in_flight, limit_per_host=0, keepalive_timeout=30
            )
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=destination.timeout),
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "exactly-delivery"},
            )
            self._sessions[destination.name] = session
        bucket = _Bucket(name, destination, session)
        self._buckets[name] = bucket
        return bucket

    # -- one bucket ----------------------------------------------------------------------------

    async def _schedule(self, bucket: _Bucket) -> None:
        assert self._stop is not None
        while not self._stop.is_set():
            now = time.time()
            room = self.page_size - bucket.held
            # page in runs of at least REFILL jobs (or when nothing is ready): a page per
            # answered job would keep the JobDB's thread busy with small queries, and the
            # outcomes' commits, which free the slots, would wait behind them
            refill = room >= min(self.page_size, REFILL) or (room > 0 and not bucket.ready)
            if refill and (not bucket.caught_up or now - bucket.paged_at >= self.poll_seconds):
                await self._page(bucket, room, now)
            while bucket.retries and bucket.retries[0][0] <= now:
                bucket.ready.append(heapq.heappop(bucket.retries)[2])
            batch, rate_wait = self._take(bucket, now)
            if batch:
                bucket.in_flight += len(batch)
                task = asyncio.create_task(self._attempt(bucket, batch))
                self._sends.add(task)
                task.add_done_callback(self._sent)
            waits = [self.poll_seconds if bucket.caught_up else 0.05]
            if bucket.retries:
                waits.append(bucket.retries[0][0] - now)
            if rate_wait is not None:
                waits.append(rate_wait)
            if batch and bucket.ready and bucket.in_flight < bucket.reserve:
                waits.append(0.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(bucket.wake.wait(), max(0.0, min(waits)))
            bucket.wake.clear()

    async def _page(self, bucket: _Bucket, room: int, now: float) -> None:
        jobs = await self._db(self.jobdb.pending, bucket.name, after=bucket.cursor, limit=room)
        bucket.paged_at = now
        bucket.caught_up = len(jobs) < room
        for job in jobs:
            bucket.cursor = max(bucket.cursor, job.id)
            if job.state == AWAITING_RETRY and job.retry_at is not None and job.retry_at > now:
                heapq.heappush(bucket.retries, (job.retry_at, job.id, job))
            else:
                bucket.ready.append(job)
        if bucket.destination.ordered and bucket.retries:  # ordered buckets wait in ``ready``
            ordered = sorted([*bucket.ready, *(entry[2] for entry in bucket.retries)], key=_id)
            bucket.ready, bucket.retries = deque(ordered), []

    def _take(self, bucket: _Bucket, now: float) -> tuple[list[Job], float | None]:
        """Jobs that may leave now within the bucket's concurrency and rate; how long to wait.

        An ordered bucket keeps every job in ``ready`` by id and sends a user's next job only
        when the one before it has succeeded or ended: a user with a job in flight or waiting
        to retry blocks that user's later jobs, never another user's.
        """
        destination = bucket.destination
        room = bucket.reserve - bucket.in_flight
        batch: list[Job] = []
        wait: float | None = None
        if not destination.ordered:
            while bucket.ready and len(batch) < room:
                allowed, wait = self._rate(bucket, now)
                if not allowed:
                    break
                batch.append(bucket.ready.popleft())
            return batch, wait
        blocked = set(bucket.users_in_flight)
        kept: deque[Job] = deque()
        while bucket.ready:
            job = bucket.ready.popleft()
            user = job.user_id or ""
            if len(batch) >= room or user in blocked:
                kept.append(job)
                continue
            blocked.add(user)
            if job.retry_at is not None and job.retry_at > now:
                kept.append(job)
                wait = job.retry_at - now if wait is None else min(wait, job.retry_at - now)
                continue
            allowed, rate_wait = self._rate(bucket, now)
            if not allowed:
                kept.append(job)
                wait = rate_wait
                room = len(batch)
                continue
            batch.append(job)
        bucket.ready = kept
        # held from now, not from step 1's commit: the next _take may run before it
        bucket.users_in_flight.update(job.user_id or "" for job in batch)
        return batch, wait

    @staticmethod
    def _rate(bucket: _Bucket, now: float) -> tuple[bool, float | None]:
        destination = bucket.destination
        if destination.rate is None:
            return True, None
        send_at, tat = shape(bucket.tat, now, Rate(destination.rate, destination.burst))
        if send_at > now:
            return False, send_at - now
        bucket.tat = tat
        return True, None

    async def _attempt(self, bucket: _Bucket, batch: list[Job]) -> None:
        """Steps 1 to 3 of the module docstring for a batch of a bucket's jobs."""
        assert self._writer is not None
        now = time.time()
        tally = self.tallies[bucket.destination.name]
        live = [job for job in batch if job.expire_at > now]
        gone = [job for job in batch if job.expire_at <= now]
        steps = [Transition(job.id, EXPIRED, job.attempt, time=now) for job in gone]
        steps += [Transition(job.id, EXECUTING, job.attempt + 1, time=now) for job in live]
        try:
            await self._writer.record(steps)  # 1. executing, durable before any request leaves
        except BaseException:
            bucket.in_flight -= len(batch)
            bucket.users_in_flight.difference_update(job.user_id or "" for job in batch)
            raise
        tally.expired += len(gone)
        bucket.in_flight -= len(gone)
        bucket.users_in_flight.difference_update(job.user_id or "" for job in gone)
        bucket.outbox.extend(live)
        for _ in range(min(len(bucket.outbox), bucket.destination.max_in_flight - bucket.senders)):
            bucket.senders += 1
            sender = asyncio.create_task(self._sender(bucket))
            self._sends.add(sender)
            sender.add_done_callback(self._sent)

    async def _sender(self, bucket: _Bucket) -> None:
        """Steps 2 and 3 for the bucket's recorded jobs, one at a time, while there are any.

        A sender holds its job until the outcome is durable, and a bucket has at most
        ``max_in_flight`` senders, so the jobs sent but not yet recorded (the duplicate window)
        never exceed ``max_in_flight``. A sender ends when the outbox is empty; one is started
        for each job only when the outbox keeps running dry.
        """
        try:
            while bucket.outbox:
                await self._send_now(bucket, bucket.outbox.popleft())
        finally:
            bucket.senders -= 1

    async def _send_now(self, bucket: _Bucket, job: Job) -> None:
        assert self._writer is not None
        destination = bucket.destination
        tally = self.tallies[destination.name]
        attempt = job.attempt + 1
        status: int | None = None
        error_type: str | None = None
        response: str | None = None
        wait: float | None = None
        headers = request_headers(
            message_id=job.message_id,
            body=job.payload,
            timestamp=int(time.time()),
            key=destination.signing_key(),
            extra=destination.headers,
        )
        started = time.monotonic()
        try:
            tally.sent += 1
            async with bucket.session.post(  # 2. the request
                destination.url, data=job.payload, headers=headers, allow_redirects=False
            ) as answer:
                status = answer.status
                text = await answer.content.read(MAX_RESPONSE)
                if not 200 <= status < 300:
                    response = text.decode("utf-8", "replace")
                    wait = retry_after(answer.headers.get("Retry-After"), time.time())
        except TimeoutError:
            error_type, response = "timeout", f"no answer within {destination.timeout:g} s"
        except aiohttp.ClientError as error:
            error_type, response = type(error).__name__, str(error) or type(error).__name__
        except OSError as error:
            error_type, response = type(error).__name__, str(error)
        if self.metrics is not None:
            self.metrics.latency.labels(destination.name).observe(time.monotonic() - started)
        step = next_step(
            job_id=job.id,
            attempt=attempt,
            expire_at=job.expire_at,
            now=time.time(),
            status=status,
            error_type=error_type,
            response=response,
            retry_after_seconds=wait,
            minimum=destination.backoff.minimum,
            maximum=destination.backoff.maximum,
            coefficient=destination.backoff.coefficient,
            jitter=self.jitter,
        )
        try:
            await self._writer.record([step])  # 3. the outcome
        finally:
            bucket.in_flight -= 1
            bucket.users_in_flight.discard(job.user_id or "")
            bucket.wake.set()
        if step.state == SUCCEEDED:
            tally.succeeded += 1
            return
        tally.last_error = f"{status or error_type}: {(response or '')[:200]}"
        if step.state == AWAITING_RETRY:
            tally.retried += 1
            assert step.retry_at is not None
            again = dataclasses.replace(
                job, state=AWAITING_RETRY, attempt=attempt, retry_at=step.retry_at
            )
            if destination.ordered:
                bucket.ready = deque(sorted([*bucket.ready, again], key=_id))
            else:
                heapq.heappush(bucket.retries, (step.retry_at, job.id, again))
        elif step.state == DISCARDED:
            tally.discarded += 1
        elif step.state == EXPIRED:
            tally.expired += 1


def _id(job: Job) -> int:
    return job.id
