"""Group commit: the director's writes gathered while the JobDB thread is busy, then committed
together; each caller waits until what it handed in is durable.

Step 1 and step 3 of an attempt (:mod:`exactly.delivery.director`) only go on once their rows
are committed, so many senders finishing at once cost one commit, not one each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from exactly.delivery.jobdb.base import Batch, BatchStep, Members, Transition
from exactly.delivery.jobdb.faces import DirectorJobs
from exactly.errors import JobDBError


@dataclass
class Writes:
    """The rows of one or more steps: jobs' transitions and, for batches, the batches formed,
    their steps and the members' transitions when a batch ends."""

    transitions: list[Transition] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    steps: list[BatchStep] = field(default_factory=list)
    members: list[Members] = field(default_factory=list)

    def add(self, other: Writes) -> None:
        self.transitions += other.transitions
        self.batches += other.batches
        self.steps += other.steps
        self.members += other.members


class Writer:
    """Group commit of :class:`Writes`: callers of :meth:`record` wait until theirs is durable;
    a failed commit is every waiter's JobDBError (the director stops, and a restart resumes
    from what the JobDB holds)."""

    def __init__(self, call: Callable[..., Awaitable[Any]], jobdb: DirectorJobs) -> None:
        self._call = call
        self._jobdb = jobdb
        self._waiting: list[tuple[Writes, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._closing = False

    async def record(self, writes: Writes) -> None:
        """Hand ``writes`` in and wait until they are committed."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((writes, future))
        self._wake.set()
        await future

    def close(self) -> None:
        """Stop :meth:`run` once what is waiting is written."""
        self._closing = True
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            waiting, self._waiting = self._waiting, []
            if not waiting:
                if self._closing:
                    return
                continue
            together = Writes()
            for writes, _ in waiting:
                together.add(writes)
            try:
                await self._commit(together)
            except Exception as error:  # noqa: BLE001 (handed to every waiter)
                refused = (
                    error
                    if isinstance(error, JobDBError)
                    else JobDBError(
                        f"the JobDB {self._jobdb.describe()} refused a write ({error}); the "
                        "director stopped, and a restart resumes from what the JobDB holds"
                    )
                )
                for _, future in waiting:
                    if not future.done():
                        future.set_exception(refused)
                continue
            for _, future in waiting:
                if not future.done():
                    future.set_result(None)

    async def _commit(self, writes: Writes) -> None:
        if writes.batches or writes.steps or writes.members:
            await self._call(
                self._jobdb.record,
                writes.transitions,
                batches=writes.batches,
                steps=writes.steps,
                members=writes.members,
            )
        else:  # a destination without batches writes as it always did
            await self._call(self._jobdb.record, writes.transitions)
