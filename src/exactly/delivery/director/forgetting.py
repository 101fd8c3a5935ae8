"""Upkeep: ``exactly forget`` while the director runs.

A running director owns the JobDB's queued jobs (some of them paged into its memory) and the
archive (its archiver writes there), so it applies the ``jobdb`` and ``archive`` stores of a
regulation itself (docs/forget.md):

1. a job of a forgotten person is never sent: every director drops such jobs from what it holds
   when a regulation appears, and from each page it reads (:meth:`Forgetting.keeps`); a pack
   loses their members only;
2. the holder of partition 0, with no archive pass under way and once the regulation is
   :data:`SETTLE_SECONDS` old (every director has dropped its jobs by then), expires and
   empties their jobs in the JobDB (``forget_jobs``), rewrites the archive's files without
   them, and marks both stores done.

Only hashes are known here: a job is the person's by its ``user_id`` (the event's userId, else
its anonymousId) or by the ids in its payload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from exactly.delivery import packs
from exactly.forget.regulations import Forgotten, Regulations

if TYPE_CHECKING:
    from exactly.delivery.archive import Archive
    from exactly.delivery.director.jobdb_thread import JobDBThread
    from exactly.delivery.director.queues import Queues
    from exactly.delivery.jobdb.base import Job
    from exactly.log import Log

STORES = ("jobdb", "archive")
SETTLE_SECONDS = 2.0  # a regulation this old was seen by every director: none holds its jobs
RETRY_MAX_SECONDS = 60.0  # the longest wait after failed turns


class Forgetting:
    """The director's regulations, read every turn of its ``forget`` chore."""

    def __init__(
        self,
        log: Log,
        key: bytes,
        calls: JobDBThread,
        archive: Archive | None,
        report: Callable[[str], None],
    ) -> None:
        self.regulations = Regulations(log)
        self.key = key
        self.calls = calls
        self.archive = archive
        self.report = report
        # read before the first dispatch: a director started after a regulation never sends
        # one job of its people (its first turn comes only after the dispatchers start)
        self.regulations.refresh()
        self.forgotten = self.regulations.forgotten(key)
        self.failures = 0  # turns failed in a row

    def failed(self, error: Exception) -> float:
        """Say that a turn failed (the JobDB busy or gone, the archive unreachable, the log
        unreadable); the seconds to wait before the next, doubling from 1 to 60. What the turn
        had done stays done: each store is marked done only once cleared, and clearing again
        what is cleared changes nothing."""
        self.failures += 1
        seconds = min(RETRY_MAX_SECONDS, 2.0 ** (self.failures - 1))
        detail = " ".join(str(error).split())[:200] or "no detail"
        self.report(
            f"forget: could not apply regulations ({type(error).__name__}: {detail}); "
            f"delivery goes on, trying again in {seconds:.0f} s"
        )
        return seconds

    def keeps(self, job: Job) -> Job | None:
        """``job`` as it may be sent: none when it is a forgotten person's, a pack without
        their members (the rest still sent, under the same key), else the same."""
        forgotten = self.forgotten
        if not forgotten:
            return job
        matches = _matches(forgotten)
        if not job.packed:
            return None if matches(job.message_id, job.user_id, job.payload) else job
        payload, gone = packs.trim(job.payload, lambda member: matches(*member))
        if payload is None:
            return None
        return dataclasses.replace(job, payload=payload) if gone else job

    async def turn(self, queues: Queues, *, applies: bool) -> bool:
        """Read new regulations; drop what memory holds of newly forgotten people; with
        ``applies`` (partition 0 held, no archive pass under way), apply the pending stores.
        Whether a store was left pending that this director should apply at the next turn.
        A failure propagates, for the loop to say it (:meth:`failed`) and retry."""
        again = await self._turn(queues, applies=applies)
        self.failures = 0
        return again

    async def _turn(self, queues: Queues, *, applies: bool) -> bool:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.regulations.refresh)
        current = self.regulations.forgotten(self.key)
        if current.hashes != self.forgotten.hashes:
            self.forgotten = current
            dropped = sum(
                bucket.reshape(self.keeps)
                for destination in queues.destinations.values()
                for bucket in destination.buckets
            )
            if dropped:
                self.report(f"forget: {dropped:,} events of forgotten people dropped, never sent")
        pending = [
            regulation
            for regulation in self.regulations.all()
            if any(store in regulation.stores and store not in regulation.done for store in STORES)
        ]
        if not pending or not applies:
            return bool(pending)
        settled = [r for r in pending if time.time() - r.at >= SETTLE_SECONDS]
        for regulation in settled:
            forgotten = Forgotten(self.key, regulation.hashes)
            if "jobdb" in regulation.stores and "jobdb" not in regulation.done:
                expired, emptied = await self.calls.call(
                    self.calls.jobdb.forget_jobs, _matches(forgotten)
                )
                report = {"queued jobs expired": expired, "jobs emptied": emptied}
                await loop.run_in_executor(
                    None, self.regulations.mark_done, regulation, "jobdb", report
                )
            if "archive" in regulation.stores and "archive" not in regulation.done:
                report = await loop.run_in_executor(None, self._rewrite_archive, forgotten)
                await loop.run_in_executor(
                    None, self.regulations.mark_done, regulation, "archive", report
                )
            self.report(f"forget: regulation {regulation.id[:8]}: jobs and archive cleared")
        return len(settled) < len(pending)

    def _rewrite_archive(self, forgotten: Forgotten) -> dict[str, int]:
        from exactly.forget.apply import rewrite_archive
        from exactly.forget.found import Found

        if self.archive is None:
            return {"files rewritten": 0, "jobs removed": 0}
        return rewrite_archive(self.archive, forgotten, Found())


def _matches(forgotten: Forgotten) -> Callable[[str, str | None, bytes], bool]:
    def matches(message_id: str, user_id: str | None, payload: bytes) -> bool:
        return bool(user_id and forgotten.ids(user_id, user_id)) or forgotten.value(payload)

    return matches
