"""The director's JobDB calls, off the event loop: one thread for the writing connection, one
for paging.

Every call but paging goes through one thread on one connection, in order, so the director
stays the single writer of its partitions' rows and a drop never runs beside a read of the same
dataset. A failing call is retried with patience (:mod:`exactly.delivery.patience`) before it
stops the director.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from exactly.delivery.jobdb.base import Job
from exactly.delivery.jobdb.faces import DirectorJobs
from exactly.delivery.patience import Patience
from exactly.errors import ExactlyError, JobDBError

T = TypeVar("T")


class JobDBThread:
    """Calls to ``jobdb`` from its thread, and pages of jobs read on a second connection."""

    def __init__(self, jobdb: DirectorJobs, patience: float, report: Callable[[str], None]) -> None:
        self.jobdb = jobdb
        self.patience = patience
        self.report = report
        self._writing = ThreadPoolExecutor(1, thread_name_prefix="jobdb")
        self._paging = ThreadPoolExecutor(1, thread_name_prefix="jobdb-paging")
        self._reader: DirectorJobs | None = None
        self._failed = False

    async def call(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call the JobDB from its thread; a failure is retried (new connection, the director
        lock checked, ``exactly.backoff`` between tries) for ``patience`` seconds, then
        raised as one JobDBError naming the JobDB and the cause."""
        loop = asyncio.get_running_loop()
        patience = Patience(
            self.jobdb.describe(),
            self.patience,
            "the director stopped, and a restart resumes from what the JobDB holds",
            self.report,
        )
        while True:
            try:
                if patience.attempt:
                    await loop.run_in_executor(self._writing, self.jobdb.keep_partitions)
                return await loop.run_in_executor(self._writing, partial(function, *args, **kwargs))
            except ExactlyError:  # decided (a lock held by another, an archive refusing)
                raise
            except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
                try:
                    pause = patience.failed(error, spent=self._failed)
                except JobDBError:
                    self._failed = True
                    raise
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._writing, self.jobdb.close)
                await asyncio.sleep(pause)

    async def pending(self, bucket: str, *, after: int, limit: int) -> list[Job]:
        """A page of ``bucket``'s pending jobs, read on a second connection in a thread of its
        own: paging (a row and a job object per job) then runs beside the commits of
        transitions instead of between them, and neither waits for the other. The page holds
        only ids above the bucket's cursor, which no write of this director has touched yet
        (open batches' members are set aside when loaded), so a read beside a write sees them
        as the director's own connection would. A failing read (or a JobDB that cannot be
        opened twice) falls back to the director's connection, its retries and patience."""
        loop = asyncio.get_running_loop()
        try:
            if self._reader is None:  # the same class on the same URL: its own connection
                self._reader = type(self.jobdb)(self.jobdb.url)  # type: ignore[call-arg]
            reader = self._reader
            return await loop.run_in_executor(
                self._paging, partial(reader.pending, bucket, after=after, limit=limit)
            )
        except Exception:  # noqa: BLE001 (each driver has its own error tree)
            if self._reader is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._paging, self._reader.close)
                self._reader = None
            return await self.call(self.jobdb.pending, bucket, after=after, limit=limit)

    def close(self) -> None:
        """Wait for the calls under way, then close the paging connection."""
        self._writing.shutdown(wait=True)
        self._paging.shutdown(wait=True)
        if self._reader is not None:
            self._reader.close()
