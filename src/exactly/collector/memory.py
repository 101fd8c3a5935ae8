"""What one worker process holds for bodies still arriving: a budget, and memory given back.

A request that sends most of a large body and stalls holds what it sent until its 408 (issue
33: 0.7 MB per connection, 2.0 GB of 2.78 GB still held after 4,000 such requests had their 408).
Two causes, two fixes, each measured with ``tests/integration/test_collector_memory.py``:

- **No bound on bodies in flight.** :class:`BodyBudget` counts the bytes a worker buffers for
  requests not yet complete (``max_buffered_bytes``, per worker process); a body that does not
  fit waits up to :data:`BUDGET_WAIT_SECONDS`, then gets 503 with ``Retry-After``. A body whose
  write key is not in a header (read before auth) may use only half of it, so such a flood cannot
  starve keyed clients.
- **Freed memory not returned.** granian hands a body over in chunks of 8 to 128 KiB made in its
  own threads, each in a glibc malloc arena of that thread; thousands of them interleaved with
  longer-lived objects fragment the arenas, which keep the pages after the requests end. The
  body is now copied into one ``bytearray`` per request (its declared length, allocated once)
  and each chunk dropped at once; :func:`tune_malloc` fixes glibc's mmap threshold at 128 KiB
  (by default it rises to the largest block freed, up to 32 MiB, after which every body buffer
  comes from the fragmented heap), so a body buffer is its own mapping and unmapped when freed;
  :func:`trim` hands back what the arenas still hold once a burst of bodies has ended.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util

BUDGET_WAIT_SECONDS = 1.0  # a body that does not fit waits this long for room, then 503
MMAP_THRESHOLD = 128 * 1024
TRIM_AFTER_BYTES = 16 << 20  # body bytes released that make a trim worth it
TRIM_EVERY_SECONDS = 1.0  # a trim comes this long after the release that called for it

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc only; musl and others have no mallopt/malloc_trim
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold (and the trim threshold with it) in this process; whether it
    could (not on a C library without ``mallopt``)."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        _LIBC.mallopt(_M_TRIM_THRESHOLD, MMAP_THRESHOLD)
    )


def trim() -> None:
    """Give the pages glibc's arenas hold free back to the system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class BodyBudget:
    """Bytes of request bodies one worker buffers at most, shared by its requests through
    :meth:`hold`. Not thread-safe: one event loop per worker."""

    def __init__(self, limit: int, *, wait: float = BUDGET_WAIT_SECONDS) -> None:
        self.limit = limit
        self.wait = wait
        self.used = 0
        self._freed: asyncio.Future[None] | None = None
        self._released = 0
        self._trim: asyncio.TimerHandle | None = None

    def hold(self, *, keyed: bool) -> Hold:
        """An empty reservation for one request's body; ``keyed``: its write key was checked
        before the body was read (else it may use only half the budget)."""
        return Hold(self, self.limit if keyed else self.limit // 2)

    async def _take(self, size: int, cap: int) -> bool:
        if self.used + size > cap:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.wait
            while self.used + size > cap:
                left = deadline - loop.time()
                if left <= 0:
                    return False
                if self._freed is None:
                    self._freed = loop.create_future()
                try:
                    await asyncio.wait_for(asyncio.shield(self._freed), left)
                except TimeoutError:
                    return False
        self.used += size
        return True

    def _give_back(self, size: int) -> None:
        self.used -= size
        if self._freed is not None:
            self._freed.set_result(None)
            self._freed = None
        self._released += size
        if self._released >= TRIM_AFTER_BYTES and self._trim is None:
            loop = asyncio.get_running_loop()
            self._trim = loop.call_later(TRIM_EVERY_SECONDS, self._trim_now)

    def _trim_now(self) -> None:
        self._trim = None
        self._released = 0
        trim()


class Hold:
    """One request's share of a :class:`BodyBudget`: grown as its body is read, given back
    whole by :meth:`release` when the request ends (however it ends)."""

    __slots__ = ("_budget", "_cap", "size")

    def __init__(self, budget: BodyBudget, cap: int) -> None:
        self._budget = budget
        self._cap = cap
        self.size = 0

    async def grow(self, size: int) -> bool:
        """Hold ``size`` more bytes, waiting for room a little; False when there is none."""
        if not await self._budget._take(size, self._cap):
            return False
        self.size += size
        return True

    def release(self) -> None:
        if self.size:
            self._budget._give_back(self.size)
            self.size = 0
