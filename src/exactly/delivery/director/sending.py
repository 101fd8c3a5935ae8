"""Sending: the three steps of an attempt, one path for a job and a batch (:mod:`.shipment`).

1. :meth:`Sending.attempt` records what was taken ``executing`` (a shipment whose time is up is
   recorded ``expired`` instead) and commits, for everything taken at once;
2. a sender (:meth:`Sending._sender`) sends each shipment when its pacing lets it leave, under
   its key (the same ``Idempotency-Key`` / ``webhook-id`` on every attempt);
3. its outcome (:func:`~exactly.delivery.policy.next_step`) is recorded and committed,
   group-committed with other outcomes, then counted in the destination's :class:`Tally`.

Nothing one request does stops the director: any error while it is built or sent is that
attempt's failure (:func:`~exactly.delivery.failures.failure`). A failed commit does: the
shipments it held are no longer in memory, and the next start reads them from the JobDB again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from exactly.delivery.client import Client
from exactly.delivery.director.queues import Bucket, Destination
from exactly.delivery.director.shipment import (
    BatchShipment,
    JobShipment,
    Shipment,
    shipment_of,
)
from exactly.delivery.director.writer import Writer, Writes
from exactly.delivery.failures import failure
from exactly.delivery.jobdb.base import (
    AWAITING_RETRY,
    DISCARDED,
    EXPIRED,
    SUCCEEDED,
    Job,
)
from exactly.delivery.metrics import DeliveryMetrics
from exactly.delivery.pacing import Pace, result_of
from exactly.delivery.policy import next_step, retry_after
from exactly.delivery.settings import DestinationSettings
from exactly.delivery.signing import request_headers

LAST_TRY = 5.0  # seconds past its expiry a shipment's last try may still leave
DIRECTOR_HEADER = "X-Exactly-Director"  # which director sent a request: its pid and a nonce


@dataclass
class Tally:
    """What one destination's requests came to during this run (a batch counts its jobs)."""

    sent: int = 0
    succeeded: int = 0
    discarded: int = 0
    retried: int = 0
    expired: int = 0
    last_error: str | None = None


class Sending:
    """Steps 1 to 3 for every destination; see the module docstring. ``mine`` says whether a
    bucket's partition is still kept (a shipment of one being given up is not sent)."""

    def __init__(
        self,
        writer: Writer,
        destinations: Iterable[str],
        *,
        tag: str,
        stop: asyncio.Event,
        mine: Callable[[str], bool],
        jitter: Callable[[], float] | None,
        metrics: DeliveryMetrics | None,
    ) -> None:
        self.writer = writer
        self.tallies = {name: Tally() for name in destinations}
        self.tag = tag
        self.jitter = jitter
        self.failure: BaseException | None = None
        self._stop = stop
        self._mine = mine
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()

    def open(self, settings: DestinationSettings) -> Destination:
        """A destination's queues with its pacing, HTTP client, signing keys and headers."""
        pace = Pace(
            rate=settings.rate,
            burst=settings.burst,
            open_after=settings.breaker.open_after or None,
            failing_for=settings.breaker.failing_for,
            probe_minimum=settings.backoff.minimum,
            probe_maximum=settings.backoff.maximum,
            jitter=self.jitter or random.random,
        )
        return Destination(
            settings,
            pace,
            client=Client(settings.url),
            keys=settings.signing_keys(),
            headers={**settings.headers, DIRECTOR_HEADER: self.tag},
        )

    def start(
        self,
        destination: Destination,
        taken: Sequence[Shipment | tuple[Bucket, list[Job]]],
    ) -> None:
        """Step 1 for what was taken: shipments, and the jobs of a new batch to form."""
        self._track(asyncio.create_task(self.attempt(destination, taken)))

    async def attempt(
        self,
        destination: Destination,
        taken: Sequence[Shipment | tuple[Bucket, list[Job]]],
    ) -> None:
        """Step 1, durable before any of their requests leaves, then on to the senders."""
        now = time.time()
        ready: list[Shipment] = []
        ended: list[Shipment] = []
        writes = Writes()
        for shipment in self._shipments(destination, taken, now):
            if shipment.expired(now):  # expired at the attempts it had
                shipment.expiry(shipment.attempt, now, writes)
                ended.append(shipment)
            else:
                shipment.executing(now, writes)
                ready.append(shipment)
        try:
            await self.writer.record(writes)  # 1.
        except BaseException:
            for shipment in [*ready, *ended]:
                shipment.release(destination, ended=True)
            raise
        tally = self.tallies[destination.name]
        for shipment in ended:
            tally.expired += shipment.events
            shipment.release(destination, ended=True)
        destination.outbox.extend(ready)
        self._add_senders(destination)

    def _add_senders(self, destination: Destination) -> None:
        """Senders for the outbox, up to the requests the destination may have out."""
        room = destination.pace.allowed(destination.settings.max_in_flight) - destination.senders
        for _ in range(min(len(destination.outbox), room)):
            destination.senders += 1
            self._track(asyncio.create_task(self._sender(destination)))

    def _shipments(
        self,
        destination: Destination,
        taken: Sequence[Shipment | tuple[Bucket, list[Job]]],
        now: float,
    ) -> Iterable[Shipment]:
        """What was taken as shipments. A new batch is formed of the jobs whose time is not
        up; the others are expired as jobs of their own."""
        for item in taken:
            if isinstance(item, Shipment):
                yield item
                continue
            bucket, jobs = item
            if len(jobs) == 1 and jobs[0].packed:  # a batch the route query made
                yield shipment_of(bucket, jobs[0], counted=True)
                continue
            alone = [JobShipment.of(bucket, job) for job in jobs]
            live = [one.job for one in alone if not one.expired(now)]
            yield from (one for one in alone if one.expired(now))
            if live:
                yield BatchShipment.form(destination.name, bucket, live, now)
            else:  # no batch after all: its place among the requests taken is free again
                destination.batches_out -= 1
                destination.wake.set()

    async def _sender(self, destination: Destination) -> None:
        """Steps 2 and 3 for the destination's recorded shipments, one at a time, while there
        are any, each when its pacing lets it leave.

        A sender holds its shipment until the outcome is durable, and a destination has at
        most ``max_in_flight`` senders, so its requests out, and the shipments sent but not yet
        recorded (the duplicate window), never exceed ``max_in_flight``. A 429 narrows that to
        the pace's window: the senders over it end, and more start as it widens again. The
        request's timeout starts when it leaves: a shipment waiting for its turn is never
        counted as an unanswered request.
        """
        maximum = destination.settings.max_in_flight
        try:
            while destination.outbox and not self._stop.is_set():
                if destination.senders > destination.pace.allowed(maximum):
                    break  # the window narrowed: one sender fewer
                shipment = destination.outbox[0]
                if not self._mine(shipment.bucket.name):  # its partition is being given up
                    destination.outbox.popleft()
                    shipment.release(destination, ended=True)
                    continue
                if time.time() > shipment.expire_at + LAST_TRY:  # held past its expiry
                    destination.outbox.popleft()
                    await self._expire_unsent(destination, shipment)
                    continue
                wait = destination.pace.take(time.time())
                if wait > 0:  # left recorded and unsent if stopped meanwhile: not a duplicate
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), min(wait, 1.0))
                    continue
                destination.outbox.popleft()  # no await since the peek: still this shipment
                await self._send(destination, shipment)
                self._add_senders(destination)  # the window may have widened
        finally:
            destination.senders -= 1

    async def _expire_unsent(self, destination: Destination, shipment: Shipment) -> None:
        """A shipment recorded for an attempt that could not leave before its expiry (a
        breaker open, a long pause): expired unsent."""
        writes = Writes()
        shipment.expiry(shipment.attempt + 1, time.time(), writes, "not sent in time")
        try:
            await self.writer.record(writes)
        finally:
            shipment.release(destination, ended=True)
        self.tallies[destination.name].expired += len(shipment.jobs)

    async def _send(self, destination: Destination, shipment: Shipment) -> None:
        """Steps 2 and 3 for one shipment."""
        settings = destination.settings
        tally = self.tallies[destination.name]
        attempt = shipment.attempt + 1
        tally.sent += 1
        status, error_type, response, wait = await self._post(  # 2. the request
            destination,
            shipment.key,
            partial(shipment.body, settings),
            shipment.content_type(settings),
        )
        now = time.time()
        destination.pace.answered(
            result_of(status, retry_after=wait),
            now,
            wait=wait,
            maximum=settings.max_in_flight,
        )
        step = next_step(
            job_id=shipment.jobs[0].id,
            attempt=attempt,
            expire_at=shipment.expire_at,
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
        writes = Writes()
        shipment.outcome(step, writes)
        try:
            await self.writer.record(writes)  # 3. the outcome
        finally:
            shipment.release(destination, ended=step.state != AWAITING_RETRY)
        count = shipment.events
        if step.state == SUCCEEDED:
            tally.succeeded += count
            return
        tally.last_error = f"{status or error_type}: {(response or '')[:200]}"
        if step.state == AWAITING_RETRY:
            tally.retried += count
            shipment.again(step, now)
        elif step.state == DISCARDED:
            tally.discarded += count
        elif step.state == EXPIRED:
            tally.expired += count

    async def _post(
        self,
        destination: Destination,
        key: str,
        make_body: Callable[[], bytes],
        content_type: str,
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
            answer = await destination.client.post(data, headers, settings.timeout)
            status = answer.status
            if not 200 <= status < 300:
                response = answer.body.decode("utf-8", "replace")
                wait = retry_after(answer.retry_after, time.time())
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 (any failure of one request is its own)
            status = None
            error_type, response = failure(error, timeout=settings.timeout, url=settings.url)
        if self._metrics is not None:
            self._metrics.latency.labels(destination.name).observe(time.monotonic() - started)
        return status, error_type, response, wait

    async def finish(self, seconds: float) -> None:
        """Let the shipments recorded ``executing`` go out (a step 1 being committed starts
        senders when it returns), for at most ``seconds``; those left stay ``executing`` and
        are sent again on the next start."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=deadline - loop.time())
            if late and loop.time() >= deadline:
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
                return

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A failed step (the JobDB refused a write) stops the director."""
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()
            self._stop.set()
