"""The bounded queue between a collector worker's requests and the log (group commit).

Requests never call the blocking log themselves. Each request's events, encoded as records with
their partitions, are sent to the worker's **appender process**
(:mod:`exactly.collector.appender_process`) with a future; the appender takes everything that
arrived, makes one durable ``append_many`` call for all of it and acknowledges; the
acknowledgement resolves the futures of every request it covers, and only then do those requests
answer 200. While one append runs the next requests gather, so the group grows with the load and
one fsync serves them all.

Why a process and not a thread: a thread of the worker shares its GIL, and the log's Python and
SQLite work then alternates with the event loop instead of running beside it; measured, that
halved the throughput (docs/benchmarks.md).

The queue is bounded in bytes: :meth:`Appender.submit` raises :class:`QueueFull` beyond
``max_pending_bytes`` and the request answers 503 with ``Retry-After``. If the appender process
dies, every waiting request fails (503: some of its events may be in the log, the client retries
and dedupe removes repeats) and a new appender process is started.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from dataclasses import dataclass

from exactly.collector.metrics import Metrics
from exactly.collector.wire import encode_request, parse_acks
from exactly.errors import LogUnavailable

logger = logging.getLogger("exactly.collector")


class QueueFull(Exception):
    """Too many bytes of events are waiting for the log; try again shortly."""


@dataclass(slots=True)
class _Pending:
    request: int
    size: int
    future: asyncio.Future[None]


class _Acks(asyncio.Protocol):
    """Reads the appender's acknowledgements and hands them to the :class:`Appender`."""

    def __init__(self, appender: Appender) -> None:
        self.appender = appender
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        for last, seconds, error in parse_acks(self.buffer):
            self.appender._acknowledged(last, seconds, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self.appender._lost(self)


class Appender:
    """A worker's side of the queue: submit a request's records, await their durability."""

    def __init__(
        self,
        log_url: str,
        topic: str,
        *,
        max_record_bytes: int,
        max_pending_bytes: int,
        metrics: Metrics,
    ) -> None:
        self.environment = {
            "EXACTLY_APPENDER_LOG": log_url,
            "EXACTLY_APPENDER_TOPIC": topic,
            "EXACTLY_APPENDER_MAX_RECORD_BYTES": str(max_record_bytes),
        }
        self.max_pending_bytes = max_pending_bytes
        self.metrics = metrics
        self.pending_bytes = 0
        self._waiting: deque[_Pending] = deque()
        self._next_request = 0
        self._transport: asyncio.Transport | None = None
        self._protocol: _Acks | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._closing = False
        self._restart: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the appender process and connect to it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "exactly.collector.appender_process"],
                pass_fds=(theirs.fileno(),),
                env={**os.environ, **self.environment, "EXACTLY_APPENDER_FD": str(theirs.fileno())},
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_unix_connection(lambda: _Acks(self), sock=ours)
        self._transport, self._protocol = transport, protocol

    def submit(self, body: bytes, size: int) -> asyncio.Future[None]:
        """Queue one request's records (``body``); the future resolves once they are durable.

        Raises :class:`QueueFull` when more than ``max_pending_bytes`` are waiting (a request is
        always taken when nothing is), :class:`LogUnavailable` when no appender runs.
        """
        if self.pending_bytes and self.pending_bytes + size > self.max_pending_bytes:
            raise QueueFull(
                f"{self.pending_bytes} bytes of events are waiting for the log; retry shortly"
            )
        transport = self._transport
        if transport is None or transport.is_closing():
            raise LogUnavailable("the appender process is restarting; retry shortly")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request = self._next_request
        self._next_request += 1
        transport.write(encode_request(request, body))
        self._waiting.append(_Pending(request, size, future))
        self.pending_bytes += size
        self._gauge()
        return future

    async def close(self) -> None:
        """Let the appender append and acknowledge what is queued, then wait for it to exit."""
        self._closing = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write_eof()
        process = self._process
        if process is not None:
            loop = asyncio.get_running_loop()
            try:
                await loop.run_in_executor(None, process.wait, 60)
            except subprocess.TimeoutExpired:
                process.kill()
        if self._transport is not None:
            self._transport.close()

    def _acknowledged(self, last: int, seconds: float, error: str) -> None:
        waiting = self._waiting
        failure = LogUnavailable(f"the log did not take the events: {error}") if error else None
        while waiting and waiting[0].request <= last:
            pending = waiting.popleft()
            self.pending_bytes -= pending.size
            if pending.future.done():  # the client went away; its events were appended anyway
                continue
            if failure is None:
                pending.future.set_result(None)
            else:
                pending.future.set_exception(failure)
        self.metrics.append_seconds.observe(seconds)
        self._gauge()

    def _lost(self, protocol: _Acks) -> None:
        if protocol is not self._protocol:
            return
        self._transport = self._protocol = None
        failure = LogUnavailable("the appender process stopped; the events may or may not be in")
        while self._waiting:
            pending = self._waiting.popleft()
            self.pending_bytes -= pending.size
            if not pending.future.done():
                pending.future.set_exception(failure)
        self._gauge()
        if not self._closing:
            logger.error("collector: the appender process stopped; starting a new one")
            if self._process is not None:
                self._process.poll()
            self._restart = asyncio.get_running_loop().create_task(self.start())

    @property
    def running(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def _gauge(self) -> None:
        self.metrics.queue_bytes.set(self.pending_bytes)
        self.metrics.queue_requests.set(len(self._waiting))
