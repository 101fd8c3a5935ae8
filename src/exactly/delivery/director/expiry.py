"""Upkeep: expiring pending jobs that will not be sent, outside the sending path.

Two reasons, each recorded as the job's ``error_type``: its destination is no longer in
``[[destinations]]`` (:data:`REMOVED`), or an operator asked for it (``exactly deliveries
expire``, :data:`~exactly.delivery.operators.BY_OPERATOR`). Expired jobs are archived like any
other, and replayable from there. A shipment whose own time is up is expired by
:mod:`.sending`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from exactly.delivery.director.jobdb_thread import JobDBThread
from exactly.delivery.director.queues import Destination, Queues
from exactly.delivery.director.sending import Tally
from exactly.delivery.director.shipment import JobShipment
from exactly.delivery.director.writer import Writer, Writes
from exactly.delivery.jobdb.base import EXPIRED, Job, Transition
from exactly.delivery.operators import BY_OPERATOR
from exactly.delivery.partitions import partition_of

REMOVED = "destination removed"


class Expiry:
    """Expires pending jobs through ``writer``, paging them from the JobDB ``page_size`` at a
    time, and counts them in ``tallies``."""

    def __init__(
        self,
        calls: JobDBThread,
        writer: Writer,
        tallies: dict[str, Tally],
        *,
        page_size: int,
        partitions: int,
        report: Callable[[str], None],
    ) -> None:
        self.calls = calls
        self.writer = writer
        self.tallies = tallies
        self.page_size = page_size
        self.partitions = partitions
        self.report = report

    async def removed(self, queues: Queues, mine: Callable[[str], bool]) -> None:
        """Expire the pending jobs of buckets whose destination was removed from the config
        (RudderStack drops them too)."""
        jobdb = self.calls.jobdb
        for name in sorted(queues.removed):
            if not mine(name):
                continue
            jobs = await self.calls.call(jobdb.pending, name, limit=self.page_size)
            if not jobs:
                continue
            now = time.time()
            await self.writer.record(
                Writes(
                    [
                        Transition(job.id, EXPIRED, job.attempt, time=now, error_type=REMOVED)
                        for job in jobs
                    ]
                )
            )
            self.report(f"bucket {name}: {len(jobs)} jobs expired ({REMOVED})")

    async def before(self, destination: Destination, before: float, partitions: set[int]) -> int:
        """Expire the destination's pending jobs created before ``before`` in ``partitions``
        (an operator's ask): those held in memory, those recorded but not sent, and those not
        yet paged in; only requests already out (and batches, which go out and end as they
        would) finish as they would. The events expired (a pack counts its members)."""
        jobdb = self.calls.jobdb
        gone: list[Job] = []
        for bucket in destination.buckets:
            if partition_of(bucket.name, self.partitions) not in partitions:
                continue
            gone += bucket.drop(lambda job: job.created_at < before)
            after = bucket.cursor
            while True:
                page = await self.calls.call(
                    jobdb.pending, bucket.name, after=after, limit=self.page_size
                )
                gone += [job for job in page if job.created_at < before]
                if len(page) < self.page_size:
                    break
                after = page[-1].id
        unsent = [
            shipment
            for shipment in destination.outbox
            if isinstance(shipment, JobShipment)
            and shipment.job.created_at < before
            and partition_of(shipment.bucket.name, self.partitions) in partitions
        ]  # recorded executing, not sent: ended with the attempt they were given
        if unsent:
            ending = set(unsent)
            destination.outbox = deque(s for s in destination.outbox if s not in ending)
        now = time.time()
        writes = Writes(
            [
                Transition(job.id, EXPIRED, job.attempt, time=now, error_type=BY_OPERATOR)
                for job in gone
            ]
        )
        for shipment in unsent:
            shipment.expiry(shipment.attempt + 1, now, writes, BY_OPERATOR)
        try:
            if writes.transitions:
                await self.writer.record(writes)
        finally:
            for shipment in unsent:
                shipment.release(destination, ended=True)
        count = sum(job.events for job in gone) + sum(shipment.events for shipment in unsent)
        self.tallies[destination.name].expired += count
        return count
