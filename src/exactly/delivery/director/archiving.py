"""Upkeep: archiving every dataset whose jobs are all finished, then dropping it.

Only the holder of partition 0 archives (:mod:`.loop`), every ``archive_seconds``, in the
background: no request waits while a file is written. Writing the file (steps 1 to 3 of
``JobDB.archive``) runs in a child process at a lower priority
(:mod:`exactly.delivery.archive.apart`), so the encoding takes neither this director's GIL nor
the cores' time before the pipeline's work; an archive that cannot be opened from its URL in
another process (one made in code) is written in a thread instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from exactly.delivery.archive import Archive, archive_name, reopens
from exactly.delivery.jobdb.faces import DirectorJobs
from exactly.errors import ArchiveError

T = TypeVar("T")


class Archiver:
    """Archive passes over ``jobdb`` into ``archive``; ``call`` is the director's JobDB thread
    (:meth:`~.jobdb_thread.JobDBThread.call`), where the drop runs."""

    def __init__(
        self,
        archive: Archive,
        jobdb: DirectorJobs,
        call: Callable[..., Awaitable[Any]],
        report: Callable[[str], None],
    ) -> None:
        self.archive = archive
        self.jobdb = jobdb
        self.archived = 0  # datasets archived and dropped during this run
        self._call = call
        self._report = report
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="archive")
        self._aside: DirectorJobs | None = None  # a second connection for steps 1 to 3
        self._apart = reopens(archive)  # steps 1 to 3 in a child process (else in the thread)
        self._child: asyncio.subprocess.Process | None = None
        self._running: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        """Whether an archive pass is under way."""
        return self._running is not None and not self._running.done()

    def start(self) -> bool:
        """Start a pass in the background unless one runs (a failed one raises); whether it
        started."""
        if self._running is not None and not self._running.done():
            return False
        if self._running is not None and self._running.exception() is not None:
            raise self._running.exception()  # type: ignore[misc]
        self._running = asyncio.create_task(self.archive_ready())
        return True

    async def finish(self) -> None:
        """The pass under way, then one more (drained: whatever has finished since)."""
        if self._running is not None:
            await self._running
        await self.archive_ready()

    async def stopped(self) -> None:
        """Wait for the pass under way to end, however it ends; then end the child."""
        if self._running is not None:
            await asyncio.gather(self._running, return_exceptions=True)
        await self._end_child()

    async def archive_ready(self) -> None:
        """Archive every dataset whose jobs are all finished (not the newest), then drop it.

        ``JobDB.archive``'s steps 1 to 3 (mark, write the file, mark) run in a child process
        (:meth:`_archive_apart`), or in a thread of their own on a second connection, so no request
        waits while a file is written; step 4, the drop, runs in line with the director's other
        JobDB calls, so none of them reads a dataset while it is dropped. A failing archive or
        second connection is reported and tried again at the next pass; delivery goes on.
        """
        archive = self.archive
        loop = asyncio.get_running_loop()
        if self._aside is None:
            from exactly.delivery.jobdb import open_jobdb

            self._aside = open_jobdb(self.jobdb.url)
        aside = self._aside

        async def call(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
            return await loop.run_in_executor(self._thread, partial(function, *args, **kwargs))

        try:
            datasets = {dataset.number: dataset for dataset in await call(aside.datasets)}
            ready = await call(aside.archivable)
        except Exception as error:  # noqa: BLE001 (each driver has its own error tree)
            self._report(f"archiving waits: the JobDB failed ({error}); tried again in a while")
            with contextlib.suppress(Exception):
                await call(aside.close)
            return
        for number in ready:
            name = archive_name(datasets[number])

            def write(records: Iterator[dict[str, Any]], name: str = name) -> None:
                archive.write(name, records)

            try:
                if self._apart:
                    await self._archive_apart(number, name)  # 1. to 3., in a child
                else:
                    await call(aside.archive, number, write, drop=False)  # 1. to 3., aside
            except Exception as error:  # noqa: BLE001 (the archive's or the driver's)
                self._report(f"dataset {number} not archived, tried again in a while: {error}")
                with contextlib.suppress(Exception):
                    await call(aside.close)
                return
            await self._call(self.jobdb.archive, number, write)  # 4. the drop, in line
            self.archived += 1
            self._report(f"dataset {number} archived to {archive.location(name)} and dropped")

    async def _archive_apart(self, number: int, name: str) -> None:
        """Steps 1 to 3 for dataset ``number`` in the child of
        :mod:`exactly.delivery.archive.apart` (started on the first pass, kept for the next
        ones); its line as an ArchiveError when it fails, and the child ended. Cancelled, the
        child is killed: archiving is idempotent until the drop."""
        child = self._child or await self._start_child()
        assert child.stdin is not None and child.stdout is not None
        try:
            child.stdin.write(json.dumps({"number": number, "name": name}).encode() + b"\n")
            await child.stdin.drain()
            answer = (await child.stdout.readline()).decode("utf-8", "replace").strip()
        except BaseException:
            await self._end_child(kill=True)
            raise
        if answer == "ok":
            return
        await self._end_child(kill=not answer)
        raise ArchiveError(answer.removeprefix("error ") or "the archiving process ended")

    async def _start_child(self) -> asyncio.subprocess.Process:
        opening = {"parent": os.getpid(), "jobdb": self.jobdb.url, "archive": self.archive.url}
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "exactly.delivery.archive.apart",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert child.stdin is not None
        child.stdin.write(json.dumps(opening).encode() + b"\n")
        self._child = child
        return child

    async def _end_child(self, *, kill: bool = False) -> None:
        """End the child: at the end of its stdin, or killed; waited for either way."""
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        if kill:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        try:
            await asyncio.wait_for(child.wait(), 10.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()

    def close(self) -> None:
        """Wait for the thread's call under way, then close the second connection."""
        self._thread.shutdown(wait=True)
        if self._aside is not None:
            self._aside.close()
