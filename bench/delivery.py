"""Delivery: which async HTTP client, and deliveries/s through the director and its JobDB.

    .venv/bin/python bench/delivery.py [--requests 20000] [--concurrency 32] [--rounds 3]
                                       [--jobdb sqlite,postgresql,mysql]
                                       [--backlog 500000] [--queued 1000000]

A fast receiver (a raw asyncio protocol on uvloop that reads each HTTP/1.1 request and answers
``200 ok``, no framework) runs in its own process on a free port of 127.0.0.1; every figure
includes it, on the same 2 cores.

(a) **Clients**: ``--requests`` POSTs of a 300-byte event, ``--concurrency`` at a time over a
keep-alive pool of as many connections, with each of ``--clients``: aiohttp, the director's own
(``exactly``: :mod:`exactly.delivery.client`, on httptools), httpx (AsyncClient),
pyreqwest (Rust reqwest/hyper on its own tokio thread) and aiosonic, all HTTP/1.1 with the same
three headers (Content-Type, Idempotency-Key, a 47-character webhook-signature), each reading the
whole answer and its status, on uvloop (the director's loop); interleaved per round; median
requests/s. A client that cannot be
imported is skipped with one line; ``--jobdb none`` (or ``''``) skips (b).

(b) **Director**: the same number of jobs added to an empty JobDB of each backend, then delivered
by :class:`exactly.delivery.director.Director` (``max_in_flight`` = ``--concurrency``) with every
transition recorded (executing, then the outcome); median deliveries/s beside the bare clients'
figures of the same round (aiohttp's and the director's own client's), and their ratios.

(c) **Backlog drain** (``--backlog``, 0 skips): that many jobs added to an empty sqlite JobDB
while no director runs (the outage), in transactions of 10,000; then a director in a process of
its own delivers them all; jobs/s from its start to drained (the process's own clock), and its
peak RSS (``VmHWM`` of ``/proc/PID/status``).

(d) **Memory with jobs queued** (``--queued``, 0 skips): that many jobs added the same way; a
director process delivers for ``--memory-seconds`` and is stopped (SIGTERM); its peak RSS.

(e) **What a drain does** (``--count N``, instead of the others): N jobs drained by a director
in this process, with its JobDB's ``pending`` queries, the jobs they found, their seconds, the
commits of transitions, and the senders started counted, to see how a drain spends the JobDB's
thread.

Prints the machine, the load average before and after, and markdown tables of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import free_port

from exactly.delivery.director import Director
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import NewJob
from exactly.delivery.settings import DestinationSettings

PAYLOAD = json.dumps(
    {
        "messageId": "m" * 27,
        "type": "track",
        "event": "Order Completed",
        "userId": "user-123456",
        "properties": {"revenue": 42.5, "currency": "EUR", "items": 3},
        "context": {"library": {"name": "analytics.js", "version": "4.1.0"}},
        "sentAt": "2026-11-23T12:00:00.000Z",
        "receivedAt": "2026-11-23T12:00:00.100Z",
    }
).encode()


class Answer200(asyncio.Protocol):
    """The fast receiver: a raw asyncio protocol reading HTTP/1.1 requests (headers, then
    ``Content-Length`` bytes of body) off a keep-alive connection and answering each with
    ``200 ok``; no routing, no header objects, so the receiver costs a few microseconds a request
    and is not what the figures measure. A subclass sees each request in :meth:`received`."""

    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] (uvloop's is no asyncio.Transport)

    def connection_lost(self, error: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        answers = 0
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end].lower()
            at = head.find(b"content-length:")
            length = 0 if at < 0 else int(head[at + 15 : head.find(b"\r\n", at) % (end + 1)])
            if len(buffer) < end + 4 + length:
                break
            self.received(head, buffer, end + 4, length)
            buffer = buffer[end + 4 + length :]
            answers += 1
        self.buffer = buffer
        if answers and self.transport is not None:
            self.transport.write(self.ANSWER * answers)

    def received(self, head: bytes, buffer: bytes, body_at: int, length: int) -> None:
        """One request: its head in lower case, its body ``buffer[body_at:body_at + length]``."""


def _serve(port: int) -> None:
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Answer200, "127.0.0.1", port, backlog=1024)
        await asyncio.Event().wait()

    uvloop.run(serve())


@contextmanager
def receiver() -> Iterator[str]:
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,))
    process.start()
    import socket

    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/in"
    finally:
        process.kill()
        process.join()


async def _aiohttp(url: str, count: int, concurrency: int) -> None:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        queue = iter(range(count))

        async def worker() -> None:
            for _ in queue:
                async with session.post(url, data=PAYLOAD, headers=HEADERS) as answer:
                    await answer.read()
                    assert answer.status == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _exactly(url: str, count: int, concurrency: int) -> None:
    from exactly.delivery.client import Client

    client = Client(url)
    queue = iter(range(count))

    async def worker() -> None:
        for _ in queue:
            answer = await client.post(PAYLOAD, HEADERS, 30)
            assert answer.status == 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    client.close()


async def _httpx(url: str, count: int, concurrency: int) -> None:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as client:
        queue = iter(range(count))

        async def worker() -> None:
            for _ in queue:
                answer = await client.post(url, content=PAYLOAD, headers=HEADERS)
                assert answer.status_code == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _pyreqwest(url: str, count: int, concurrency: int) -> None:
    from pyreqwest.client import ClientBuilder

    builder = ClientBuilder().http1_only().max_connections(concurrency)
    async with builder.pool_max_idle_per_host(concurrency).build() as client:
        queue = iter(range(count))

        async def worker() -> None:
            for _ in queue:
                request = client.post(url).headers(HEADERS).body_bytes(PAYLOAD).build()
                answer = await request.send()  # a built (not streamed) request reads the body
                await answer.bytes()
                assert answer.status == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _aiosonic(url: str, count: int, concurrency: int) -> None:
    import aiosonic
    from aiosonic.pools import PoolConfig

    # max_conn_requests=None: keep each connection (aiosonic recycles one after 1000 by default)
    pool = PoolConfig(size=concurrency, max_conn_requests=None)
    connector = aiosonic.TCPConnector(pool_configs={":default": pool})
    async with aiosonic.HTTPClient(connector) as client:
        queue = iter(range(count))

        async def worker() -> None:
            for _ in queue:
                answer = await client.post(url, data=PAYLOAD, headers=HEADERS)
                await answer.content()
                assert answer.status_code == 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    await connector.cleanup()  # a connector of our own is not closed with the client


HEADERS = {
    "Content-Type": "application/json",
    "Idempotency-Key": "m" * 27,
    "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
}
CLIENTS: dict[str, Callable[[str, int, int], Coroutine[Any, Any, None]]] = {
    "aiohttp": _aiohttp,
    "exactly": _exactly,
    "httpx": _httpx,
    "pyreqwest": _pyreqwest,
    "aiosonic": _aiosonic,
}


def importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def client_rate(name: str, url: str, count: int, concurrency: int) -> float:
    client = CLIENTS[name]
    import uvloop  # the director's loop: a bare client is timed on the same

    return count / timed(lambda: uvloop.run(client(url, count, concurrency)))


@contextmanager
def empty_jobdb(backend: str) -> Iterator[str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.jobdb import jobdb_url

    with tempfile.TemporaryDirectory() as directory, jobdb_url(backend, Path(directory)) as url:
        yield url


def director_rate(backend: str, url: str, count: int, concurrency: int) -> float:
    target = DestinationSettings(
        name="bench",
        url=url,
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # type: ignore[arg-type]
        max_in_flight=concurrency,
    )
    with empty_jobdb(backend) as jobdb_url, open_jobdb(jobdb_url) as db:
        jobs = [
            NewJob("web", "bench", PAYLOAD, f"m{i}", expire_at=time.time() + 3600)
            for i in range(count)
        ]
        for batch, start in enumerate(range(0, count, 10_000)):
            db.add(jobs[start : start + 10_000], query_id="bench", batch_id=batch)
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
        seconds = timed(lambda: director.run(until_drained=True))
        assert director.tallies["bench"].succeeded == count, director.tallies
        return count / seconds


def _fill(db_url: str, count: int) -> None:
    """Add ``count`` jobs for the destination ``bench`` straight into the JobDB, 10,000 per
    transaction."""
    expire = time.time() + 4 * 3600
    with open_jobdb(db_url) as db:
        for batch, start in enumerate(range(0, count, 10_000)):
            jobs = [
                NewJob("web", "bench", PAYLOAD, f"m{i}", expire_at=expire)
                for i in range(start, min(count, start + 10_000))
            ]
            db.add(jobs, query_id="bench", batch_id=batch)


def _direct(db_url: str, url: str, concurrency: int, answer: Any) -> None:
    """A director process: deliver until drained (or SIGTERM); send back (seconds, succeeded)."""
    target = DestinationSettings(
        name="bench",
        url=url,
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # type: ignore[arg-type]
        max_in_flight=concurrency,
    )
    with open_jobdb(db_url) as db:
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
        started = time.perf_counter()
        director.run(until_drained=True)
        answer.put((time.perf_counter() - started, director.tallies["bench"].succeeded))


def counted_drain(url: str, count: int, concurrency: int) -> dict[str, float]:
    """(e): deliveries/s of a drain of ``count`` jobs, and what its JobDB and senders did."""
    from exactly.delivery.jobdb.base import Job
    from exactly.delivery.jobdb.sqlite import SqliteJobDB

    figures = dict.fromkeys(("queries", "found", "query_s", "commits", "steps", "senders"), 0.0)

    class Counting(SqliteJobDB):
        def pending(self, bucket: str, *, after: int = 0, limit: int = 10_000) -> list[Job]:
            started = time.perf_counter()
            jobs = super().pending(bucket, after=after, limit=limit)
            figures["query_s"] += time.perf_counter() - started
            figures["queries"] += 1
            figures["found"] += len(jobs)
            return jobs

        def record(self, transitions: Any) -> None:
            figures["commits"] += 1
            figures["steps"] += len(transitions)
            super().record(transitions)

    target = DestinationSettings(
        name="bench",
        url=url,
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # type: ignore[arg-type]
        max_in_flight=concurrency,
    )
    with empty_jobdb("sqlite") as db_url:
        _fill(db_url, count)
        with Counting(db_url) as db:
            director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
            sender = director.sending._sender

            async def counted(destination: Any) -> None:
                figures["senders"] += 1
                await sender(destination)

            director.sending._sender = counted
            figures["deliveries_per_s"] = count / timed(lambda: director.run(until_drained=True))
    return figures


def peak_rss_mb(pid: int) -> float:
    """``VmHWM`` of a live process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def director_process(
    url: str, count: int, concurrency: int, seconds: float | None
) -> tuple[float, int, float]:
    """``count`` jobs queued in an empty sqlite JobDB, then a director process delivers them
    (stopped after ``seconds`` when given); (delivery seconds, delivered, peak RSS in MB)."""
    context = multiprocessing.get_context("spawn")
    with empty_jobdb("sqlite") as db_url:
        _fill(db_url, count)
        answer = context.Queue()
        process = context.Process(target=_direct, args=(db_url, url, concurrency, answer))
        process.start()
        assert process.pid is not None
        peak = 0.0
        deadline = None if seconds is None else time.monotonic() + seconds
        while process.is_alive() and answer.empty():
            peak = max(peak, peak_rss_mb(process.pid))
            if deadline is not None and time.monotonic() > deadline:
                os.kill(process.pid, signal.SIGTERM)
                deadline = None
            time.sleep(0.2)
        taken, delivered = answer.get(timeout=600)
        process.join()
        return taken, delivered, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobdb", default="sqlite,postgresql,mysql")
    parser.add_argument("--clients", default=",".join(name for name in CLIENTS if importable(name)))
    parser.add_argument("--backlog", type=int, default=500_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--memory-seconds", type=float, default=30.0)
    parser.add_argument("--count", type=int, metavar="N", help="only (e), over N jobs")
    args = parser.parse_args()
    loads = [os.getloadavg()]
    if args.count:
        with receiver() as url:
            figures = counted_drain(url, args.count, args.concurrency)
        print("| measure | figure |\n|---|---:|")
        for name, value in figures.items():
            print(f"| {name} | {value:,.2f} |")
        return
    backends = [name for name in args.jobdb.split(",") if name and name != "none"]
    clients = []
    for name in filter(None, args.clients.split(",")):
        if name not in CLIENTS:
            parser.error(f"--clients: {name} is none of {', '.join(CLIENTS)}")
        elif importable(name):
            clients.append(name)
        else:
            print(f"{name}: not importable, skipped")
    rates: dict[str, list[float]] = {}
    with receiver() as url:
        client_rate("aiohttp", url, 2000, args.concurrency)  # warm up
        for _ in range(args.rounds):
            for name in clients:
                rates.setdefault(name, []).append(
                    client_rate(name, url, args.requests, args.concurrency)
                )
            for backend in backends:
                rates.setdefault(f"director/{backend}", []).append(
                    director_rate(backend, url, args.requests, args.concurrency)
                )
        drains = []
        if args.backlog:
            taken, delivered, peak = director_process(url, args.backlog, args.concurrency, None)
            assert delivered == args.backlog, (delivered, args.backlog)
            drains.append((f"drain of a {args.backlog:,}-job backlog", args.backlog / taken, peak))
        if args.queued:
            taken, delivered, peak = director_process(
                url, args.queued, args.concurrency, args.memory_seconds
            )
            drains.append((f"{args.queued:,} jobs queued, {taken:.0f} s", delivered / taken, peak))
    loads.append(os.getloadavg())
    print(
        f"\n{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}; load average "
        f"{' / '.join(f'{a:.1f} {b:.1f} {c:.1f}' for a, b, c in loads)} (before / after); "
        f"{args.requests} requests, concurrency {args.concurrency}, {args.rounds} rounds "
        "(medians)\n"
    )
    bare = statistics.median(rates.get("aiohttp", [float("nan")]))
    own = statistics.median(rates.get("exactly", [float("nan")]))
    print(
        "| what | requests/s | ratio to bare aiohttp | ratio to bare exactly client |\n"
        "|---|---:|---:|---:|"
    )
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / bare:.2f} | {median / own:.2f} |")
    if drains:
        print("\n| director process, sqlite | deliveries/s | peak RSS (VmHWM) |\n|---|---:|---:|")
        for what, rate, peak in drains:
            print(f"| {what} | {rate:,.0f} | {peak:,.0f} MB |")


if __name__ == "__main__":
    main()
