"""Partition leases: which of the JobDB's partitions this director sends the jobs of.

The JobDB's buckets are spread over ``partitions`` (:mod:`exactly.delivery.partitions`); a
director holds the lease of some of them and is the only writer of their jobs' transitions.
Every ``lease_seconds`` it checks its leases, writes its heartbeat and keeps its fair share
(:meth:`Leases.renew`); a director alone takes them all, and one started when every partition
is held waits (a standby) in :meth:`Leases.take_first`.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from exactly.delivery.director.queues import Queues
from exactly.delivery.jobdb.faces import DirectorJobs
from exactly.delivery.partitions import (
    fair_share,
    partition_of,
    portion,
    probe_order,
    rate_portion,
    to_release,
)

PARTITIONS_HELD = (
    "stop another director first, let this one wait for a free partition (without "
    "--no-wait), or raise [delivery] partitions to run more directors"
)


class Leases:
    """This director's leases on ``jobdb``: those ``held``, and of them those ``leaving`` (being
    given up: nothing new is sent for their buckets)."""

    def __init__(
        self, jobdb: DirectorJobs, partitions: int, seconds: float, report: Callable[[str], None]
    ) -> None:
        self.jobdb = jobdb
        self.partitions = partitions
        self.seconds = seconds
        self.report = report
        self.tag = f"{os.getpid()}.{random.getrandbits(32):08x}"  # X-Exactly-Director
        self.name = f"{socket.gethostname()}:{self.tag}"  # in jobdb_directors
        self.held: set[int] = set()
        self.leaving: set[int] = set()

    @property
    def kept(self) -> set[int]:
        """The partitions held and not being given up."""
        return self.held - self.leaving

    def mine(self, bucket: str) -> bool:
        """Whether ``bucket`` is in a partition this director leases and keeps."""
        partition = partition_of(bucket, self.partitions)
        return partition in self.held and partition not in self.leaving

    def take_first(self, *, wait: bool) -> bool:
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
            time.sleep(self.seconds)

    def _took(self, partition: int) -> None:
        self.held.add(partition)
        if partition == 0:  # its holder does the upkeep: tables a crash left unlisted
            for number in self.jobdb.drop_orphans():
                self.report(f"dropped the tables of dataset {number}, which no dataset lists")

    async def renew(self, call: Callable[..., Awaitable[Any]], queues: Queues) -> None:
        """Check the leases (a lost one stops the director: PartitionLost), heartbeat, give
        up partitions above the fair share ``ceil(P / live directors)`` (the highest first,
        never 0) once nothing of theirs is out, take free ones up to it, and set each
        destination's portion of its limits. ``call`` runs a JobDB call in its thread."""
        jobdb = self.jobdb
        await call(jobdb.keep_partitions)
        live = await call(jobdb.heartbeat, self.name, sorted(self.held), time.time())
        share = fair_share(self.partitions, live)
        for partition in to_release(self.kept, share):
            self.leaving.add(partition)
            queues.keep(self.mine)
        for partition in sorted(self.leaving):
            theirs = [
                bucket
                for name, bucket in queues.buckets.items()
                if partition_of(name, self.partitions) == partition
            ]
            if any(bucket.taken for bucket in theirs):
                continue  # in flight: released once their outcomes are recorded
            for bucket in theirs:
                del queues.buckets[bucket.name]
            await call(jobdb.release_partition, partition)
            self.held.discard(partition)
            self.leaving.discard(partition)
            self.report(f"released partition {partition} ({live} directors, {share} each)")
        if len(self.held) < share:
            for partition in probe_order(self.partitions, random.randrange(self.partitions)):
                if len(self.held) >= share:
                    break
                if partition in self.held:
                    continue
                if await call(jobdb.take_partition, partition):
                    await call(self._took, partition)
                    self.report(f"took partition {partition} ({live} directors, {share} each)")
        self.portions(queues)

    def portions(self, queues: Queues) -> None:
        """Each destination's ``rate``, ``burst`` and ``max_in_flight`` for this director:
        the destination's limit × the share of the partitions holding its buckets that this
        director keeps (:func:`~exactly.delivery.partitions.portion`)."""
        if self.partitions <= 1:
            return
        spreads: dict[str, set[int]] = {}
        for name in queues.listed:
            spreads.setdefault(name.rpartition("/")[2], set()).add(
                partition_of(name, self.partitions)
            )
        kept = self.kept
        for name, destination in queues.destinations.items():
            configured = queues.configured[name]
            spread = spreads.get(name, set())
            in_flight = portion(configured.max_in_flight, kept, spread)
            if destination.settings.max_in_flight != in_flight:
                destination.settings = configured.model_copy(update={"max_in_flight": in_flight})
            destination.pace.rate = rate_portion(configured.rate, kept, spread)
            destination.pace.burst = portion(configured.burst, kept, spread)

    def release_all(self) -> None:
        """Give every lease up and leave (the director stops); errors are the JobDB's to
        forget: a lease not given up expires."""
        for partition in sorted(self.held):
            with contextlib.suppress(Exception):
                self.jobdb.release_partition(partition)
        with contextlib.suppress(Exception):
            self.jobdb.leave(self.name)
