"""The connection front: at most ``per_address`` open connections per client address, the least
recently active of that address closed first (issue 33: one host holding 10,000 sockets, reopening
each one closed, made everyone else's requests take 3-5 s).

granian has no accept-time hook and the ASGI app never sees a connection that sends nothing, so
with ``[collector] max_connections_per_address`` above 0 ``exactly collect`` runs this front in
its own process on the public port, and granian listens on a unix socket in a private directory
(mode 0700). What the front does, and what it does not:

- **Bytes pass untouched.** asyncio Protocols join the client's transport to granian's: each
  chunk is written on in ``data_received`` (no coroutine per chunk, no HTTP parsing, nothing a
  client could forge or smuggle); a full write buffer on one side pauses reading on the other.
- **Idle sockets are cheap.** The socket to granian is opened at a connection's first bytes, so
  a connection that sends nothing costs the front one file and granian nothing; the front closes
  it after ``idle_timeout``. Once bytes flowed, granian's own timeouts apply and its close
  closes the client's connection.
- **The client address is carried** by the name of the unix socket: each socket to granian is
  bound to ``DIR/<n>_<address>`` (then unlinked; the kernel keeps the name), granian gives that
  name as the ASGI ``client``, and :func:`address_of` reads the address back, so the rate and
  byte limits see the real client. Only this process can bind in ``DIR``.
- **Caps**, per address as the rate limits key it (:func:`~exactly.collector.ratelimit.client_key`:
  IPv4 as is, IPv6 per /64) and in total (``max_connections`` x workers): at either, the least
  recently active connection (of that address, or of all) is closed before the new one is served.
- It runs until its parent, ``exactly collect``, is gone (its stdin is a pipe from the parent:
  end of file stops it); SIGINT and SIGTERM are the parent's to handle, so the front keeps
  carrying answers while granian drains.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

from exactly.collector.memory import trim, tune_malloc
from exactly.collector.ratelimit import client_key

SOCKET_NAME = "granian.sock"
CONNECT_PATIENCE = 10.0  # seconds a first request waits for granian's socket (start, overload)
SWEEP_SECONDS = 1.0
READ_BYTES = 64 * 1024  # read from a client at once
WRITE_HIGH = 16 * 1024  # bytes waiting for granian past which the client is not read


@dataclass(frozen=True)
class FrontSettings:
    """What the front runs with; passed to its process as JSON on the command line."""

    directory: str  # private: granian's socket and the names of the sockets to it
    per_address: int
    total: int
    idle_timeout: float
    backlog: int  # the listener's again: the event loop listens anew, with 100 unless told

    @property
    def upstream(self) -> str:
        return os.path.join(self.directory, SOCKET_NAME)


def address_of(client: str, directory: str) -> str | None:
    """The client address behind a front socket name (``DIR/<n>_<address>``), else None."""
    head, _, name = client.rpartition("/")
    if head != directory:
        return None
    return name.partition("_")[2] or None


class Front:
    """The connections held, per address and in all, each ordered least recently active first."""

    def __init__(self, settings: FrontSettings) -> None:
        self.settings = settings
        self.by_address: dict[str, OrderedDict[Client, None]] = {}
        self.everyone: OrderedDict[Client, None] = OrderedDict()
        self.silent: dict[Client, float] = {}  # no byte yet: when each was opened
        self.names = itertools.count()
        self.buffer = memoryview(bytearray(READ_BYTES))  # every client's reads, one at a time
        self.held_before = 0
        self.loop = asyncio.get_running_loop()

    def admit(self, client: Client) -> None:
        """Make room for ``client`` (closing the least recently active), then hold it."""
        held = self.by_address.get(client.key)
        if held is not None and len(held) >= self.settings.per_address:
            self.drop(next(iter(held)))
        if len(self.everyone) >= self.settings.total:
            self.drop(next(iter(self.everyone)))
        held = self.by_address.get(client.key)  # a drop may have emptied and removed it
        if held is None:
            held = self.by_address[client.key] = OrderedDict()
        held[client] = None
        self.everyone[client] = None
        self.silent[client] = self.loop.time()

    def touch(self, client: Client) -> None:
        """``client`` is now the most recently active, of its address and of all."""
        if client in self.everyone:
            self.everyone.move_to_end(client)
            self.by_address[client.key].move_to_end(client)

    def drop(self, client: Client) -> None:
        self.forget(client)
        client.transport.close()

    def forget(self, client: Client) -> None:
        held = self.by_address.get(client.key)
        if held is not None:
            held.pop(client, None)
            if not held:
                del self.by_address[client.key]
        self.everyone.pop(client, None)
        self.silent.pop(client, None)

    def sweep(self) -> None:
        """Close the connections that sent nothing for ``idle_timeout`` (oldest first); give
        freed memory back to the system when connections went since the last sweep."""
        if len(self.everyone) < self.held_before:
            trim()
        self.held_before = len(self.everyone)
        oldest = self.loop.time() - self.settings.idle_timeout
        for client, opened in list(self.silent.items()):
            if opened > oldest:
                break
            self.drop(client)
        self.loop.call_later(SWEEP_SECONDS, self.sweep)

    async def connect(self, client: Client) -> None:
        """Open ``client``'s socket to granian, named after its address, and join the two."""
        address = client.address.partition("%")[0]  # no IPv6 zone: the limits ignore it
        path = os.path.join(self.settings.directory, f"{next(self.names)}_{address}")
        deadline = self.loop.time() + CONNECT_PATIENCE
        while not client.closed:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                sock.bind(path)
                try:
                    await self.loop.sock_connect(sock, self.settings.upstream)
                finally:
                    os.unlink(path)
                await self.loop.create_unix_connection(lambda: Upstream(client), sock=sock)
                return
            except OSError:
                sock.close()
                if self.loop.time() > deadline:
                    break
                await asyncio.sleep(0.05)
        client.transport.close()


class Client(asyncio.BufferedProtocol):
    """One client connection; its bytes go to granian through :class:`Upstream`.

    Read into the front's one buffer of :data:`READ_BYTES` (the event loop would read 256 KiB at
    a time): a connection whose granian side stopped reading holds at most one such chunk and
    the write buffer's high-water mark here, not a large read (issue 33, item 1's stalled
    bodies)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.eof = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "unknown"
        self.key = client_key(self.address)
        self.front.admit(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.front.buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.front.buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        front = self.front
        front.touch(self)
        if self.upstream is not None:
            self.upstream.write(data)
            return
        self.pending.append(data)
        if front.silent.pop(self, None) is not None:  # the first bytes: join granian
            self.transport.pause_reading()
            front.loop.create_task(front.connect(self))

    def joined(self, upstream: asyncio.Transport) -> None:
        self.upstream = upstream
        upstream.write(b"".join(self.pending))
        self.pending = []
        if self.eof:
            upstream.write_eof()
        else:
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eof = True
        if self.upstream is not None:
            self.upstream.write_eof()
        return True  # the answer may still come

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.front.forget(self)
        if self.upstream is not None:
            self.upstream.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()


class Upstream(asyncio.Protocol):
    """The socket to granian of one :class:`Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        if self.client.closed:
            transport.close()
        else:
            self.client.joined(cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        client = self.client
        client.transport.write(data)
        client.front.touch(client)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()

    def pause_writing(self) -> None:
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class _Parent(asyncio.Protocol):
    """The pipe from ``exactly collect``: its end stops the front."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def run(settings: FrontSettings, listener: socket.socket) -> None:
    """Serve ``listener`` (already bound and listening) until stdin is closed."""
    loop = asyncio.get_running_loop()
    front = Front(settings)
    server = await loop.create_server(
        lambda: Client(front), sock=listener, backlog=settings.backlog
    )
    loop.call_later(SWEEP_SECONDS, front.sweep)
    done: asyncio.Future[None] = loop.create_future()
    await loop.connect_read_pipe(lambda: _Parent(done), sys.stdin)
    await done
    server.close()


def main() -> None:
    """``python -m exactly.collector.front SETTINGS_JSON FD``: the front of ``exactly collect``."""
    import uvloop

    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    tune_malloc()  # a read chunk is its own mapping, given back when written
    settings = FrontSettings(**json.loads(sys.argv[1]))
    listener = socket.socket(fileno=int(sys.argv[2]))
    uvloop.run(run(settings, listener))


if __name__ == "__main__":
    main()
