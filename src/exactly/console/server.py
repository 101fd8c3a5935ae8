"""The web console's HTTP server: an aiohttp application in a thread of ``exactly up``.

* ``GET /``: the page, rendered with the current state; its script polls ``/api/state``;
* ``GET /favicon.svg`` (and ``/favicon.ico``, which browsers ask for unbidden): the page's icon;
* ``GET /api/state``: the state as JSON (:mod:`exactly.console.state`, fields in docs/up.md);
* ``GET /api/trace/<messageId>``: every hop of one message (:func:`exactly.trace.trace`) as
  ``exactly trace --json`` prints it, plus ``text`` as ``exactly trace`` prints it; 404 (the
  same body) for an id nothing holds, 400 with one line when it cannot be traced;
* anything else: 404 with a JSON body naming the path; a failure to read: 500 with one line.

The server runs its own event loop in a daemon thread, so ``up``'s main thread keeps its signal
handling and its supervisor loop as they are; reads run one at a time on a daemon thread of
their own (the reader keeps the log and the aggregate database open), traces on another.
:meth:`Console.stop` ends it when ``up`` stops (in at most 2 s), and a SIGKILLed ``up`` takes
the threads with it. The console has no login and changes nothing: it listens on 127.0.0.1
unless ``[console] host`` says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from exactly.config import Settings
from exactly.errors import ConfigError, EnvironmentProblem

if TYPE_CHECKING:
    from aiohttp import web

    from exactly.up.supervisor import Supervisor

MAX_MESSAGE_ID = 1000  # characters; the collector keeps ids far shorter
STOP_SECONDS = 2.0  # within up's 30 s: its parts are stopped by then


class Console:
    """The console of one ``exactly up``; a context manager that starts and stops it."""

    def __init__(
        self,
        settings: Settings,
        supervisor: Supervisor | None = None,
        *,
        say: Callable[[str], None] = print,
    ) -> None:
        from exactly.console.state import Reader

        self.settings = settings
        self.reader = Reader(settings, supervisor)
        self.say = say
        self.port = settings.console.port
        self._reads = Worker("console-read")
        self._traces = Worker("console-trace")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.console.host}:{self.port}"

    def __enter__(self) -> Console:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Listen (raises :class:`ConfigError` when the port is taken) and serve in a thread."""
        try:
            import aiohttp  # noqa: F401 - a base dependency; missing only in a broken install
        except ImportError as error:
            raise EnvironmentProblem(
                f"the console needs aiohttp, a dependency of exactly ({error}): pip install "
                "'aiohttp>=3.12', or set [console] port = 0 for no console"
            ) from None
        self._thread = threading.Thread(target=self._serve, name="console", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            host, port = self.settings.console.host, self.settings.console.port
            raise ConfigError(
                f"the console cannot listen on {host}:{port}: {self._error}; set [console] port "
                "(or EXACTLY_CONSOLE__PORT) to a free port, or 0 for no console"
            )
        self.say(f"console on {self.url}")

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(STOP_SECONDS)
        self._reads.submit(self.reader.close)
        self._reads.stop()
        self._traces.stop()

    # -- the server's thread --------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # noqa: BLE001 - reported by start()
            self._error = error
        finally:
            self._ready.set()

    async def _main(self) -> None:
        from aiohttp import web

        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        runner = web.AppRunner(
            self.application(), access_log=None, shutdown_timeout=STOP_SECONDS / 2
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.settings.console.host, self.settings.console.port)
            await site.start()
            self._ready.set()
            await self._stopped.wait()
        finally:
            await runner.cleanup()

    def application(self) -> web.Application:
        from aiohttp import web

        app = web.Application(middlewares=[web.middleware(_errors_as_json)])
        app.router.add_get("/", self._page)
        app.router.add_get("/favicon.svg", _favicon)
        app.router.add_get("/favicon.ico", _favicon)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/trace/{message_id:.+}", self._trace)
        return app

    async def _read(self, function: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self._reads.submit(function))

    async def _state(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        document = await self._read(self.reader.state)
        return web.json_response(document, headers={"Cache-Control": "no-store"})

    async def _trace(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        from exactly.errors import ExactlyError

        message_id = request.match_info["message_id"]
        if len(message_id) > MAX_MESSAGE_ID:
            return web.json_response(
                {"error": f"a messageId is at most {MAX_MESSAGE_ID} characters"}, status=400
            )
        try:
            found = await asyncio.wrap_future(self._traces.submit(lambda: self._follow(message_id)))
        except ExactlyError as error:
            return web.json_response({"error": str(error)}, status=400)
        status = 200 if found["found"] else 404
        if not found["found"]:
            found["error"] = f"unknown messageId {message_id!r}: no log record or job holds it"
        return web.json_response(found, status=status, headers={"Cache-Control": "no-store"})

    def _follow(self, message_id: str) -> dict[str, Any]:
        from exactly.trace import render, trace

        found = trace(self.settings, message_id)
        return {**found.to_json(), "text": render(found)}

    async def _page(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        from exactly.console.page import render

        document = await self._read(self.reader.state)
        return web.Response(
            text=render(document), content_type="text/html", headers={"Cache-Control": "no-store"}
        )


async def _favicon(request: web.Request) -> web.StreamResponse:
    from aiohttp import web

    from exactly.console.page import FAVICON

    return web.Response(
        text=FAVICON, content_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
    )


class Worker:
    """Runs calls one at a time on one daemon thread: a read stuck on a database that does not
    answer never holds up ``up``'s exit (a pool's threads are joined at exit; this one is not),
    and what the reader opened stays in the thread that opened it."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, function: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((function, future))
        return future

    def stop(self) -> None:
        self._calls.put(None)

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            function, future = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(function())
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting request
                future.set_exception(error)


async def _errors_as_json(request: Any, handler: Any) -> Any:
    """404 and 405 as JSON naming the path; a failure to read as a 500 with its one line."""
    from aiohttp import web

    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return web.json_response(
            {"error": f"{error.reason}: {request.method} {request.path}"}, status=error.status
        )
    except Exception as error:  # noqa: BLE001 - one line to the client, the console goes on
        return web.json_response({"error": f"{type(error).__name__}: {error}"}, status=500)
