"""The director's HTTP/1.1 client: one destination's keep-alive connections, a prepared request
head, and only what an attempt's outcome needs from the answer.

A director sends one request per event to a single-event destination, so the client's cost per
request bounds how fast a backlog drains. A general client builds a request object, a URL, a
header multidict, a response object and a stream per request; this one writes one buffer to a
pooled connection and reads the answer with httptools (the llhttp parser): the status, the
``Retry-After`` header and the body's first :data:`~exactly.delivery.jobdb.base.MAX_RESPONSE`
bytes. ``bench/delivery.py`` measures it against aiohttp.

What it does not do, as the director never asks for it: follow redirects (a 3xx is the
answer), send through a proxy, keep cookies or decompress (it sends no ``Accept-Encoding``).
A request is timed from when :meth:`Client.post` is called, connecting included; the exchanges
under way by one sweep of the client's connections every :data:`SWEEP` seconds (a loop timer
per request, 4.9 µs, was about a tenth of a bare request), which fails an exchange past its
deadline and closes its connection: a request times out within ``SWEEP`` after its timeout.

Every failure is one of :class:`RequestFailed`'s kinds (the resolver's, the socket's or TLS's
own error inside :class:`ConnectFailed`), a ConnectionResetError, a TimeoutError, or a ValueError
for a request it will not send; :func:`exactly.delivery.failures.failure` tells each in a line a
person reads. A connection whose exchange did not end cleanly (a failure, a
timeout, a cancel) is closed, never reused.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import httptools
from yarl import URL

from exactly.delivery.jobdb.base import MAX_RESPONSE

IDLE_SECONDS = 15.0  # an idle connection older than this is closed, not reused
DRAIN_LIMIT = 1 << 20  # body bytes read past MAX_RESPONSE before the connection is closed instead
SWEEP = 0.05  # seconds between checks of the exchanges under way for their deadlines


class RequestFailed(Exception):
    """A request that got no usable answer from ``host``:``port``."""

    def __init__(self, message: str, host: str, port: int) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


class ConnectFailed(RequestFailed):
    """No connection: ``os_error`` is what the resolver, the socket or TLS raised."""

    def __init__(self, os_error: OSError, host: str, port: int, *, dns: bool = False) -> None:
        super().__init__(str(os_error), host, port)
        self.os_error = os_error
        self.dns = dns


class Disconnected(RequestFailed):
    """The connection closed before the status line."""


class Malformed(RequestFailed):
    """The answer is not HTTP/1.x: the parser's finding."""


class CutShort(RequestFailed):
    """The connection closed inside the answer's body."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    retry_after: str | None
    body: bytes  # its first MAX_RESPONSE bytes


class Client:
    """Requests to one URL over keep-alive connections, as many as are asked for at once (the
    director's senders bound them to the destination's ``max_in_flight``)."""

    def __init__(self, url: str, *, user_agent: str = "exactly-delivery") -> None:
        parsed = URL(url)
        if parsed.scheme not in ("http", "https"):
            raise ValueError(f"not an http:// or https:// URL: {parsed.scheme}://")
        self.host = parsed.raw_host or ""
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._tls: ssl.SSLContext | None = (
            ssl.create_default_context() if parsed.scheme == "https" else None
        )
        lines = [
            f"POST {parsed.raw_path_qs or '/'} HTTP/1.1",
            f"Host: {parsed.host_port_subcomponent}",
            f"User-Agent: {user_agent}",
        ]
        self._credentials = parsed.raw_user is not None or parsed.raw_password is not None
        if self._credentials:
            pair = f"{parsed.user or ''}:{parsed.password or ''}".encode()
            lines.append(f"Authorization: Basic {base64.b64encode(pair).decode()}")
        self._head = "\r\n".join(lines) + "\r\n"
        self._idle: list[_Connection] = []
        self._out: set[_Connection] = set()  # exchanges under way, for the sweep
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._closed = False

    async def post(self, body: bytes, headers: Mapping[str, str], timeout: float) -> Answer:
        """POST ``body`` with ``headers`` (each a name and a value on one line) and its answer,
        or TimeoutError once ``timeout`` seconds have passed without it. Raises ValueError for
        a header holding a line break, or an Authorization header when the URL has user info,
        before anything is sent."""
        if self._credentials and any(name.lower() == "authorization" for name in headers):
            raise ValueError("the URL has user info and an Authorization header is given")
        fields = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if fields.count("\n") != len(headers) or fields.count("\r") != len(headers):
            raise ValueError("a header name or value holds a line break")
        head = f"{self._head}{fields}Content-Length: {len(body)}\r\n\r\n".encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        connection = self._reused()
        if connection is None:
            async with asyncio.timeout_at(deadline):
                connection = await self._connect()
        connection.deadline = deadline
        self._out.add(connection)
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(SWEEP, self._sweep)
        try:
            answer = await connection.exchange(head + body)
        except BaseException:
            connection.close()
            raise
        finally:
            self._out.discard(connection)
        if connection.reusable and not self._closed:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    def close(self) -> None:
        """Close the idle connections; those in use close as their exchange ends (or times
        out: the sweep goes on while any is under way)."""
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def _sweep(self) -> None:
        """Fail the exchanges past their deadlines; again in :data:`SWEEP` seconds while any
        is under way."""
        self._sweep_timer = None
        if not self._out:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in [c for c in self._out if c.deadline <= now]:
            connection.fail(TimeoutError())
        if self._out:
            self._sweep_timer = loop.call_later(SWEEP, self._sweep)

    def _reused(self) -> _Connection | None:
        """The idle connection used last, if it is still open and fresh."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable and now - connection.idle_since < IDLE_SECONDS:
                return connection
            connection.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(self.host, self.port),
                self.host,
                self.port,
                ssl=self._tls,
                server_hostname=self.host if self._tls is not None else None,
            )
        except socket.gaierror as error:
            raise ConnectFailed(error, self.host, self.port, dns=True) from error
        except OSError as error:  # ssl.SSLError and ConnectionError are OSErrors too
            raise ConnectFailed(error, self.host, self.port) from error
        return connection


class _Connection(asyncio.Protocol):
    """One connection: a request written, its answer parsed as it arrives."""

    def __init__(self, host: str, port: int) -> None:
        self._where = (host, port)
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Answer] | None = None
        self._status: int | None = None
        self._retry_after: str | None = None
        self._framed = False  # the answer's length is known (Content-Length or chunked)
        self._length: int | None = None  # its Content-Length
        self._body = bytearray()
        self._read = 0
        self.reusable = False
        self.idle_since = 0.0
        self.deadline = 0.0  # the loop's clock: the client's sweep fails the exchange after it

    async def exchange(self, request: bytes) -> Answer:
        """``request`` written, and its answer (or what :meth:`fail` was given)."""
        if self._transport is None or self._transport.is_closing():
            raise Disconnected("the connection closed while idle", *self._where)
        self._answer = asyncio.get_running_loop().create_future()
        self._expect()
        self.reusable = False
        self._transport.write(request)
        return await self._answer

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.reusable = True

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():  # nothing asked: not a usable peer
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.fail(Malformed("an upgrade to another protocol", *self._where))
        except httptools.HttpParserError as error:
            self.fail(Malformed(_parser_finding(error), *self._where))

    def connection_lost(self, error: Exception | None) -> None:
        self.reusable = False
        if self._answer is None or self._answer.done():
            return
        if self._status is None:
            if isinstance(error, ConnectionResetError):
                self.fail(error)
            else:
                self.fail(Disconnected("closed before the status line", *self._where))
        elif self._framed:
            told = "" if self._length is None else f" of {self._length}"
            closed = f"the connection closed after {self._read}{told} bytes"
            self.fail(CutShort(closed, *self._where))
        else:  # a body that ends where the connection does
            self._done()

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"retry-after":
            self._retry_after = value.decode("latin-1")
        elif lowered == b"content-length":
            self._framed, self._length = True, int(value)  # llhttp has checked it
        elif lowered == b"transfer-encoding":
            self._framed = True

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        room = MAX_RESPONSE - len(self._body)
        if room > 0:
            self._body += body[:room]
        self._read += len(body)
        if self._read > MAX_RESPONSE + DRAIN_LIMIT:  # enough of it: answer now, then close
            self._done()
            self.close()

    def on_message_complete(self) -> None:
        if self._status is not None and 100 <= self._status < 200:  # interim: the answer follows
            self._expect()
            return
        keep = self._parser.should_keep_alive()
        self._done()
        self.reusable = keep and self._transport is not None and not self._transport.is_closing()
        if not keep:
            self.close()

    def _expect(self) -> None:
        """Nothing read yet of the answer to come."""
        self._status, self._retry_after, self._framed, self._length = None, None, False, None
        self._body.clear()
        self._read = 0

    def _done(self) -> None:
        if self._answer is not None and not self._answer.done():
            assert self._status is not None
            self._answer.set_result(Answer(self._status, self._retry_after, bytes(self._body)))

    def fail(self, error: Exception) -> None:
        """End the exchange under way with ``error`` and close the connection."""
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)
        self.close()


def _parser_finding(error: httptools.HttpParserError) -> str:
    """llhttp's reason, in HTTP's words where it names other protocols."""
    text = str(error) or type(error).__name__
    return "Bad status line" if text.startswith("Expected HTTP/") else text
