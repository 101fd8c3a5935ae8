"""A scripted HTTP receiver on loopback for delivery tests, run in a thread of the test process.

Paths choose the behaviour (``N`` counts the requests for one ``webhook-id``):

* ``/ok``: 200;  ``/status/C``: always status C with a body naming it;
* ``/flaky/K``: 500 for the first K requests of an id, then 200;
* ``/throttle/K``: 429 with ``Retry-After: 1`` for the first K requests of an id, then 200;
* ``/hang/S``: answers 200 after S seconds (past the destination's timeout, a timeout);
* ``/flap``: 503 while :attr:`Receiver.down` is set, else 200;
* ``/scripted``: 500 for the first :attr:`Receiver.failures` ``[id]`` requests of an id, then 200;
* ``/slow/S``: 200 after S seconds;
* ``/unlucky/M``: 500 for the first request of an id whose CRC-32 is a multiple of M (batch ids
  are not known beforehand: this fails about one batch in M once);
* ``/busy``: 429 with ``Retry-After: 1`` until :attr:`Receiver.busy_until` (monotonic), then 200.

:attr:`Receiver.peak` is the most requests it held at once.

Every request is kept (path, headers, body, time) in :attr:`Receiver.requests`, with the time
it was answered once it is. The times are ``time.monotonic()``: tests measure intervals between
arrivals, which a step of the wall clock would bend (sorted by a stepped clock, arrivals a rate
kept apart look bunched), and crash tests compare them with the moment of a kill.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from types import TracebackType

from aiohttp import web

from tests.servers import free_port


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    status: int = 0
    answered: float = 0.0  # when its answer was ready (0: not yet)


class Receiver:
    def __init__(self, *, delay: float = 0.0) -> None:
        self.port = free_port()
        self.delay = delay
        self.requests: list[Received] = []
        self.down = False
        self.failures: dict[str, int] = {}
        self.busy_until = 0.0
        self.held = 0
        self.peak = 0
        self._seen: Counter[tuple[str, str]] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ids(self, path: str | None = None) -> Counter[str]:
        """How many requests each webhook-id got (on ``path`` only, if given)."""
        return Counter(
            r.headers["webhook-id"] for r in list(self.requests) if path in (None, r.path)
        )

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        kept = Received(request.path, dict(request.headers), body, time.monotonic())
        self.requests.append(kept)  # kept on arrival, its status set once answered
        at = len(self.requests) - 1
        self.held += 1
        self.peak = max(self.peak, self.held)
        try:
            answer = await self._answer(request)
        finally:
            self.held -= 1
        self.requests[at] = dataclasses.replace(
            kept, status=answer.status, answered=time.monotonic()
        )
        return answer

    def successes(self, path: str | None = None) -> Counter[str]:
        """How many 2xx answers each webhook-id got (on ``path`` only, if given)."""
        return Counter(
            r.headers["webhook-id"]
            for r in list(self.requests)
            if 200 <= r.status < 300 and path in (None, r.path)
        )

    async def _answer(self, request: web.Request) -> web.Response:
        path = request.path
        key = (path, request.headers.get("webhook-id", ""))
        self._seen[key] += 1
        count = self._seen[key]
        parts = path.strip("/").split("/")
        if self.delay:
            await asyncio.sleep(self.delay)
        if parts[0] == "status":
            return web.Response(status=int(parts[1]), text=f"status {parts[1]} " + "x" * 2000)
        if parts[0] == "flaky" and count <= int(parts[1]):
            return web.Response(status=500, text="try again")
        if parts[0] == "throttle" and count <= int(parts[1]):
            return web.Response(status=429, headers={"Retry-After": "1"}, text="slow down")
        if parts[0] == "busy" and time.monotonic() < self.busy_until:
            return web.Response(status=429, headers={"Retry-After": "1"}, text="busy")
        if parts[0] in ("hang", "slow"):
            await asyncio.sleep(float(parts[1]))
        if parts[0] == "scripted" and count <= self.failures.get(key[1], 0):
            return web.Response(status=500, text="scripted failure")
        if (
            parts[0] == "unlucky"
            and count == 1
            and zlib.crc32(key[1].encode()) % int(parts[1]) == 0
        ):
            return web.Response(status=500, text="unlucky")
        if parts[0] == "flap" and self.down:
            return web.Response(status=503, text="down")
        return web.Response(text="ok")

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, backlog=1024)
        await site.start()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Receiver:
        def main() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._serve())
            self._loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the receiver did not start"
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)
