"""Reading a request body within its size limit, gzip included, and the HTTP errors it raises."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from exactly.collector.memory import Hold

Receive = Callable[[], Awaitable[dict[str, Any]]]

_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS  # zlib detects either header


class HTTPError(Exception):
    """An answer other than success: status, a machine-readable code and a sentence."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        extra: dict[str, Any] | None = None,
        drain: bool = True,
    ) -> None:
        super().__init__(message)
        self.drain = drain  # read what is left of the body before answering (else close)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.extra = extra or {}

    def body(self) -> bytes:
        return orjson.dumps(
            {"success": False, "code": self.code, "message": self.message, **self.extra}
        )


class ClientGone(Exception):
    """The client disconnected before its body arrived; there is nobody to answer."""


def too_large(limit: int) -> HTTPError:
    return HTTPError(413, "too_large", f"the request body is larger than {limit} bytes")


# What the collector still reads, and throws away, of a body it refuses as too large. A server
# that answers and closes while the client is still sending resets the connection, and the
# client sees "server disconnected" instead of the 413; reading a little more lets the answer
# arrive. Past these bounds the connection is closed anyway.
DRAIN_BYTES = 4 << 20
DRAIN_SECONDS = 2.0


async def drain(receive: Receive, more: bool = True) -> bool:
    """Read and throw away what is left of a body, within :data:`DRAIN_BYTES` and
    :data:`DRAIN_SECONDS`; whether it was all read (else the connection must close)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    drained = 0
    while more and drained <= DRAIN_BYTES:
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            break
        if message["type"] == "http.disconnect":
            return True  # nobody left to answer, nothing left to read
        drained += len(message.get("body", b""))
        more = message.get("more_body", False)
    return not more


# How long the collector goes on reading, and throwing away, a body it left unread after an
# answer that closes the connection. Closing a socket with unread input makes the kernel send a
# reset at once, and a reset that reaches the client before it has read the answer destroys the
# answer: 8 posts in 100 of an 8 MB body saw "connection reset" instead of their 413. A client
# that sends its whole body before reading (most do) reads the answer once its body is in; one
# still sending after this is cut off. Nothing read is kept, yet reading takes the server's
# buffers: a 503 for want of room in the body budget does not linger (1,000 stalled clients
# took 300 MB more at the peak when it did).
LINGER_SECONDS = 2.0


async def linger(receive: Receive) -> None:
    """Read and drop what the client still sends, for at most :data:`LINGER_SECONDS`, after an
    answer that closes the connection (a lingering close, as nginx does)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LINGER_SECONDS
    while (left := deadline - loop.time()) > 0:
        try:
            message = await asyncio.wait_for(receive(), left)
        except TimeoutError:
            return
        if message["type"] == "http.disconnect" or not message.get("more_body", False):
            return


async def _refuse(receive: Receive, limit: int, more: bool) -> HTTPError:
    """The 413 for a body over ``limit``, after draining what is left of it, within bounds."""
    refusal = too_large(limit)
    if not await drain(receive, more):  # the rest is left unread: no other request can follow
        refusal.headers = ((b"connection", b"close"),)
    return refusal


class TrackedBody:
    """A request's ``receive``, noting whether reading its body began.

    An answer given before the body is read (404, 405, a wrong key, 429) must drain it first, as
    a 413 does: a server that answers and closes while the client is still sending resets the
    connection, and the client sees "server disconnected" instead of the answer (1 request in 30
    with a 378 KB body to an unknown path, before). A 408 or 413 raised while reading has dealt
    with the rest itself.
    """

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.started = False

    async def __call__(self) -> dict[str, Any]:
        self.started = True
        return await self._receive()


class NoRoom(Exception):
    """The worker's budget for bodies in flight has no room for this one (see
    :class:`~exactly.collector.memory.BodyBudget`). The rest of the body is not read: reading it,
    even to throw it away, costs the memory the budget is there to bound; the connection closes.
    """


async def read_body(
    receive: Receive,
    limit: int,
    declared: int | None,
    timeout: float | None = None,
    total: float | None = None,
    hold: Hold | None = None,
) -> bytearray:
    """The raw body, at most ``limit`` bytes (413 beyond, checked before reading if declared).

    408 when the client sends nothing for ``timeout`` seconds, or has not sent the whole body
    within ``total`` seconds: a slow client (one byte, then nothing; or a trickle) must not hold
    a worker, nor its shutdown, for long. The bytes are counted in ``hold`` before they are read
    (the declared length at once, else chunk by chunk): :class:`NoRoom` when it has none.

    The body is copied into one buffer, the declared length allocated once, and each chunk is
    dropped as soon as it is copied (:mod:`exactly.collector.memory` says why).
    """
    if declared is not None and declared > limit:
        raise await _refuse(receive, limit, more=declared - limit <= DRAIN_BYTES)
    if hold is not None and declared and not await hold.grow(declared):
        raise NoRoom
    loop = asyncio.get_running_loop()
    deadline = None if total is None else loop.time() + total
    body = bytearray(declared or 0)
    size = 0
    while True:
        wait = timeout
        if deadline is not None:
            left = max(0.0, deadline - loop.time())
            wait = left if wait is None else min(wait, left)
        try:
            message = await asyncio.wait_for(receive(), wait)
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                stalled = f"took more than {total:g} s"
            else:
                stalled = f"stalled for more than {timeout:g} s"
            raise HTTPError(
                408,
                "timeout",
                f"the request body {stalled}",
                headers=((b"connection", b"close"),),  # the rest of it is not read
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            end = size + len(chunk)
            if end > limit:
                raise await _refuse(receive, limit, more=more)
            if hold is not None and end > hold.size and not await hold.grow(end - hold.size):
                raise NoRoom
            body[size:end] = chunk
            size = end
        del chunk, message
        if not more:
            break
    if size < len(body):
        del body[size:]
    return body


def decode(body: bytes | bytearray, encoding: bytes | None, limit: int) -> bytes | bytearray:
    """``body`` without its Content-Encoding (gzip, x-gzip, deflate or identity), within ``limit``.

    Decompression stops at ``limit`` + 1 bytes, so a small body that inflates hugely costs no
    more than a large plain one.
    """
    if encoding is None:
        return body
    name = encoding.strip().lower()
    if name in (b"", b"identity"):
        return body
    if name not in (b"gzip", b"x-gzip", b"deflate"):
        raise HTTPError(
            415,
            "unsupported_encoding",
            "Content-Encoding must be gzip, deflate or identity",
        )
    parts: list[bytes] = []
    size = 0
    rest = body
    try:
        while True:
            inflater = zlib.decompressobj(_GZIP_OR_ZLIB)
            part = inflater.decompress(rest, limit + 1 - size)
            size += len(part)
            if size > limit or inflater.unconsumed_tail:
                raise too_large(limit)
            parts.append(part)
            if not inflater.eof:
                raise HTTPError(400, "invalid_encoding", "the compressed body is truncated")
            rest = inflater.unused_data
            if not rest.strip(b"\0"):  # gzip members may be followed by zero padding
                break
    except zlib.error as error:
        raise HTTPError(
            400, "invalid_encoding", f"the body is not valid {name.decode()}: {error}"
        ) from None
    return b"".join(parts)
