"""Each destination's dispatcher: pages its buckets in, takes jobs (or forms batches) in turn
within the destination's reserve, and hands them to :mod:`.sending`.

Jobs are paged in per bucket (at most ``page_size`` held per source and destination, in
flight and waiting to retry included: a destination's ``lanes`` share it), so memory stays
bounded with millions queued. A batching destination first loads the batches a previous run
left open: they are sent again whole, under their ids, before anything new.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import time
from collections.abc import Callable

from exactly.delivery.director.jobdb_thread import JobDBThread
from exactly.delivery.director.queues import Bucket, Destination
from exactly.delivery.director.sending import Sending
from exactly.delivery.director.shipment import BatchShipment, Shipment, shipment_of
from exactly.delivery.jobdb.base import AWAITING_RETRY, EXECUTING, Job
from exactly.delivery.packs import packing
from exactly.delivery.settings import DestinationSettings

REFILL = 1_000  # jobs: a bucket pages more in once it has room for this many


class Dispatch:
    """The loop of each destination (:meth:`run`), until ``stop`` is set."""

    def __init__(
        self,
        calls: JobDBThread,
        sending: Sending,
        stop: asyncio.Event,
        *,
        page_size: int,
        poll_seconds: float,
    ) -> None:
        self.calls = calls
        self.sending = sending
        self.stop = stop
        self.page_size = page_size
        self.poll_seconds = poll_seconds
        # a forgotten person's job is never placed, and a pack holding them is placed without
        # them (:meth:`~exactly.delivery.director.forgetting.Forgetting.keeps`)
        self.keeps: Callable[[Job], Job | None] | None = None

    async def run(self, destination: Destination) -> None:
        """Page each bucket in, take jobs in turn within the destination's reserve and start
        step 1 for them; wait for a slot, a retry's time or the next poll."""
        batching = destination.settings.batching
        while not self.stop.is_set():
            now = time.time()
            waits = [self.poll_seconds]
            lanes = destination.settings.lanes
            held = max(min(self.page_size, REFILL), self.page_size // lanes)
            for bucket in list(destination.buckets):
                room = held - bucket.held_events
                # page in runs of at least REFILL jobs (or when nothing is ready): a page per
                # answered job would keep the JobDB's thread busy with small queries, and the
                # outcomes' commits, which free the slots, would wait behind them
                refill = room >= min(held, REFILL) or (room > 0 and not bucket.ready)
                if batching and not bucket.loaded:
                    await self._load_batches(bucket, now)
                if refill and (not bucket.caught_up or now - bucket.paged_at >= self.poll_seconds):
                    await self._page(bucket, room, now, destination.settings)
                bucket.due(now)
                if not bucket.caught_up:
                    waits.append(0.05)
                if bucket.retries:
                    waits.append(bucket.retries[0][0] - now)
            taken: list[Shipment | tuple[Bucket, list[Job]]]
            if batching:
                formed, held_back = destination.form(now)
                taken = list(formed)
                more = destination.batches_out < destination.reserve
            else:
                jobs, held_back = destination.take(now)
                taken = [shipment_of(bucket, job) for bucket, job in jobs]
                more = destination.taken < destination.reserve
            if taken:
                self.sending.start(destination, taken)
                if more:
                    waits.append(0.0)
            if held_back is not None:
                waits.append(held_back)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(destination.wake.wait(), max(0.0, min(waits)))
            destination.wake.clear()

    async def _page(
        self, bucket: Bucket, room: int, now: float, settings: DestinationSettings
    ) -> None:
        """Page in up to ``room`` events: as many jobs, or, while the bucket's jobs are packs
        (or may be: a destination the route query packs for, before its first page), as many
        full packs as fit."""
        limit = room
        if bucket.packs or (bucket.paged_at == 0.0 and packing(settings)):
            limit = max(1, room // settings.batch.max_events)
        jobs = await self.calls.pending(bucket.name, after=bucket.cursor, limit=limit)
        bucket.paged_at = now
        bucket.caught_up = len(jobs) < limit
        if jobs:
            bucket.packs = any(job.packed for job in jobs)
        bucket.place(jobs, now, self.keeps)

    async def _load_batches(self, bucket: Bucket, now: float) -> None:
        """The batches a previous run left open (in flight at a crash, or waiting to retry):
        sent again whole, under their ids, before anything new; their members are never paged
        in as jobs of their own."""
        jobdb = self.calls.jobdb
        for found in await self.calls.call(jobdb.open_batches, bucket.name):
            jobs = [  # a member's attempts before the batch (an `executing` row: older JobDBs)
                dataclasses.replace(job, attempt=max(0, job.attempt - 1))
                if job.state == EXECUTING
                else job
                for job in found.jobs
            ]
            if not jobs:
                continue
            attempt = found.attempt if found.state == AWAITING_RETRY else found.attempt - 1
            held = BatchShipment(bucket, jobs, attempt, found.retry_at, batch=found.batch)
            bucket.in_batches.update(job.id for job in jobs if job.id > bucket.cursor)
            bucket.taken += len(jobs)
            if bucket.ordered:
                bucket.users_out.update(job.user_id or "" for job in jobs)
            due = found.retry_at if found.state == AWAITING_RETRY and found.retry_at else now
            heapq.heappush(bucket.batches, (due, jobs[0].id, held))
        bucket.loaded = True
