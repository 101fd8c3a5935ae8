"""Upkeep: the metrics' queue gauges (``--metrics-port``), measured from memory every second;
the jobs not yet paged in are counted in the JobDB every 5 s (:mod:`.loop`'s schedule)."""

from __future__ import annotations

from exactly.delivery.director.jobdb_thread import JobDBThread
from exactly.delivery.director.queues import Destination, Queues
from exactly.delivery.metrics import DeliveryMetrics, Gauges


class Gauging:
    """Keeps ``metrics``' gauges: per destination, its jobs queued, in flight and waiting to
    retry, and the age of the oldest it holds."""

    def __init__(self, metrics: DeliveryMetrics, calls: JobDBThread) -> None:
        self.metrics = metrics
        self.calls = calls
        self._unpaged: dict[str, int] = {}  # per bucket, as last counted

    async def count_unpaged(self, queues: Queues) -> None:
        """Count the datasets, and each bucket's pending jobs not paged in yet."""
        jobdb = self.calls.jobdb
        self.metrics.datasets = len(await self.calls.call(jobdb.datasets))
        for name, bucket in queues.buckets.items():
            self._unpaged[name] = (
                0
                if bucket.caught_up
                else await self.calls.call(jobdb.unpaged, name, after=bucket.cursor)
            )

    def measure(self, destinations: dict[str, Destination], now: float) -> None:
        """Set the gauges from what ``destinations`` hold at ``now``."""
        self.metrics.gauges = gauges(destinations, self._unpaged, now)


def gauges(
    destinations: dict[str, Destination], unpaged: dict[str, int], now: float
) -> dict[str, Gauges]:
    """Each destination's gauges at ``now``, with ``unpaged`` jobs per bucket not yet in
    memory (those paged since they were counted are not counted twice)."""
    figures: dict[str, list[float]] = {}
    for destination in destinations.values():
        entry = figures.setdefault(destination.name, [0, 0, 0, now])
        for bucket in destination.buckets:
            waiting = sum(
                1 for job in bucket.ready if job.retry_at is not None and job.retry_at > now
            )
            paged_out = 0 if bucket.caught_up else unpaged.get(bucket.name, 0)
            entry[0] += len(bucket.ready) - waiting + paged_out
            entry[1] += bucket.taken
            entry[2] += len(bucket.retries) + waiting
            held = [job.created_at for job in bucket.ready]
            held += [job.created_at for _, _, job in bucket.retries]
            entry[3] = min([entry[3], *held])
    return {
        name: Gauges(int(queued), int(in_flight), int(retrying), max(0.0, now - oldest))
        for name, (queued, in_flight, retrying, oldest) in figures.items()
    }
