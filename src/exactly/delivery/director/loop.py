"""The director's main loop: it wires the parts together and runs the chores of its schedule.

Once a second (or faster while draining) the loop lists the JobDB's buckets, opens those of its
partitions it has not seen (a destination's first bucket starts its dispatcher,
:mod:`.dispatch`), expires the jobs of removed destinations, and runs the chores that are due
(:mod:`.schedule`): renewing the leases, applying operators' controls, archiving (the holder of
partition 0) and refreshing the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Iterable

import uvloop

from exactly.delivery.archive import Archive
from exactly.delivery.director.archiving import Archiver
from exactly.delivery.director.controls import Controls
from exactly.delivery.director.dispatch import Dispatch
from exactly.delivery.director.expiry import REMOVED, Expiry
from exactly.delivery.director.forgetting import Forgetting
from exactly.delivery.director.gauges import Gauging
from exactly.delivery.director.jobdb_thread import JobDBThread
from exactly.delivery.director.leases import PARTITIONS_HELD, Leases
from exactly.delivery.director.queues import Bucket, Destination, Queues
from exactly.delivery.director.schedule import Schedule
from exactly.delivery.director.sending import Sending, Tally
from exactly.delivery.director.writer import Writer
from exactly.delivery.jobdb.faces import DirectorJobs
from exactly.delivery.metrics import DeliveryMetrics
from exactly.delivery.settings import DestinationSettings
from exactly.errors import DirectorLockHeld
from exactly.text import message as wrapped

LEASE, CONTROLS, ARCHIVE, UNPAGED, METRICS = "lease", "controls", "archive", "unpaged", "metrics"
FORGET = "forget"


def say(message: str) -> None:
    print(wrapped(f"deliver: {message}"), file=sys.stderr, flush=True)


class Director:
    """Sends the jobs of ``jobdb`` to ``destinations``; see the package docstring.

    Its attributes are its parts: ``queues`` (what it holds in memory, by name), ``calls`` (the
    JobDB thread), ``leases``, ``writer`` (group commit), ``dispatch`` and ``sending``, and the
    upkeep run on ``schedule``: ``controls``, ``expiry``, ``archiver`` and ``gauging``.
    """

    def __init__(
        self,
        jobdb: DirectorJobs,
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
        forgetting: Callable[[JobDBThread, Archive | None], Forgetting] | None = None,
    ) -> None:
        self.jobdb = jobdb
        self.report = report
        self.queues = Queues({destination.name: destination for destination in destinations})
        self.calls = JobDBThread(jobdb, jobdb_patience, report)
        self.leases = Leases(jobdb, partitions, lease_seconds, report)
        self.writer = Writer(self.calls.call, jobdb)
        self.metrics_port = metrics_port
        self.metrics = None if metrics_port is None else DeliveryMetrics(lambda: self.tallies)
        self._stop = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sending = Sending(
            self.writer,
            self.queues.configured,
            tag=self.leases.tag,
            stop=self._stop,
            mine=self.leases.mine,
            jitter=jitter,
            metrics=self.metrics,
        )
        self.dispatch = Dispatch(
            self.calls, self.sending, self._stop, page_size=page_size, poll_seconds=poll_seconds
        )
        self.expiry = Expiry(
            self.calls,
            self.writer,
            self.tallies,
            page_size=page_size,
            partitions=partitions,
            report=report,
        )
        self.controls = Controls(self.calls, self.expiry, report)
        self.archiver = (
            None if archive is None else Archiver(archive, jobdb, self.calls.call, report)
        )
        self.gauging = None if self.metrics is None else Gauging(self.metrics, self.calls)
        self.forgetting = None if forgetting is None else forgetting(self.calls, archive)
        if self.forgetting is not None:
            self.dispatch.keeps = self.forgetting.keeps
        chores = {LEASE: lease_seconds, CONTROLS: 1.0}
        if self.forgetting is not None:
            chores[FORGET] = 1.0
        if self.archiver is not None:
            chores[ARCHIVE] = archive_seconds
        if self.gauging is not None:
            chores |= {UNPAGED: 5.0, METRICS: 1.0}
        self.schedule = Schedule(chores)

    @property
    def tallies(self) -> dict[str, Tally]:
        """What each destination's requests came to during this run."""
        return self.sending.tallies

    @property
    def archived(self) -> int:
        """Datasets archived and dropped during this run."""
        return 0 if self.archiver is None else self.archiver.archived

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
        if not self.leases.take_first(wait=wait):
            raise DirectorLockHeld(
                f"another director holds the lock of {self.jobdb.describe()} (each of its "
                f"{self.leases.partitions} partitions is leased); {PARTITIONS_HELD}"
            )
        try:
            uvloop.run(self.deliver(until_drained=until_drained))
        finally:
            self.calls.close()
            if self.archiver is not None:
                self.archiver.close()
            self.leases.release_all()
        return self.tallies

    def stop(self) -> None:
        """Ask a director running in another thread to stop, as SIGTERM does."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def deliver(self, *, until_drained: bool = False) -> None:
        """Deliver until stopped (or, with ``until_drained``, until nothing is pending)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        for number in (signal.SIGTERM, signal.SIGINT):
            # ValueError: uvloop, not on the main thread (tests run the director in a thread)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(number, self._stop.set)
        writer = asyncio.create_task(self.writer.run())
        dispatchers: list[asyncio.Task[None]] = []
        queues = self.queues
        try:
            while not self._stop.is_set():
                due = self.schedule.due(time.time())
                if LEASE in due:
                    await self.leases.renew(self.calls.call, queues)
                queues.listed = await self.calls.call(self.jobdb.buckets)
                for name in queues.listed:
                    if not self.leases.mine(name):
                        continue
                    if name not in queues.buckets and name not in queues.removed:
                        destination = self._open_bucket(name)
                        if destination is not None:
                            dispatchers.append(asyncio.create_task(self.dispatch.run(destination)))
                if queues.removed:
                    await self.expiry.removed(queues, self.leases.mine)
                await self._upkeep(due)
                if until_drained and await self._drained():
                    if self.archiver is not None and 0 in self.leases.held:
                        await self.archiver.finish()
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0 if not until_drained else 0.2)
                for task in dispatchers:
                    if task.done() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
            if self.sending.failure is not None:
                raise self.sending.failure
        finally:
            self._stop.set()
            for destination in queues.destinations.values():
                destination.wake.set()
            await asyncio.gather(*dispatchers, return_exceptions=True)
            if self.archiver is not None:
                await self.archiver.stopped()
            longest = max(destination.timeout for destination in queues.configured.values())
            await self.sending.finish(longest + 1)
            self.writer.close()
            await writer
            for destination in queues.destinations.values():
                destination.client.close()

    async def _upkeep(self, due: list[str]) -> None:
        """The chores due besides the leases: archiving (partition 0's holder archives, in
        the background), operators' controls and the metrics."""
        archiver = self.archiver
        if ARCHIVE in due and archiver is not None:
            started = 0 in self.leases.held and archiver.start()
            if not started:  # a pass under way, or not this director's: at the next turn
                self.schedule.missed(ARCHIVE)
        if CONTROLS in due:
            await self.controls.apply(self.queues.destinations, self.leases.kept)
        if FORGET in due and self.forgetting is not None:
            # partition 0's holder applies, with no archive pass under way
            applies = 0 in self.leases.held and (archiver is None or not archiver.busy)
            try:
                again = await self.forgetting.turn(self.queues, applies=applies)
            except Exception as error:  # noqa: BLE001 - a regulation never stops delivery
                self.schedule.postpone(FORGET, time.time(), self.forgetting.failed(error))
            else:
                if again:
                    self.schedule.missed(FORGET)
        if self.gauging is not None:
            if UNPAGED in due:
                await self.gauging.count_unpaged(self.queues)
            if METRICS in due:
                self.gauging.measure(self.queues.destinations, time.time())

    async def _drained(self) -> bool:
        """Whether nothing is pending in the buckets of this director's partitions."""
        queues = self.queues
        if not queues.idle:
            return False
        for name in queues.buckets:
            if await self.calls.call(self.jobdb.pending, name, limit=1):
                return False
        known = set(queues.buckets) | queues.removed
        listed = await self.calls.call(self.jobdb.buckets)
        return all(name in known for name in listed if self.leases.mine(name))

    def _open_bucket(self, name: str) -> Destination | None:
        """Add a new bucket to its destination; the destination when it is new too (its
        dispatcher is then to be started), else None. A bucket whose destination is no longer
        configured is set aside: its jobs are expired (:meth:`.Expiry.removed`)."""
        queues = self.queues
        settings = queues.configured.get(name.rpartition("/")[2])
        if settings is None:
            queues.removed.add(name)
            self.report(
                f"bucket {name}: its destination is not in [[destinations]] any more; "
                f"its jobs are expired ({REMOVED})"
            )
            return None
        destination = queues.destinations.get(settings.name)
        fresh = destination is None
        if destination is None:
            destination = self.sending.open(settings)
            queues.destinations[settings.name] = destination
        bucket = Bucket(name, ordered=settings.ordered)
        destination.buckets.append(bucket)
        queues.buckets[name] = bucket
        destination.wake.set()
        return destination if fresh else None
