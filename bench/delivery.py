"""Delivery: which async HTTP client, and deliveries/s through the director and its JobDB.

    .venv/bin/python bench/delivery.py [--requests 20000] [--concurrency 32] [--rounds 3]
                                       [--jobdb sqlite,postgresql,mysql]

A fast receiver (aiohttp on uvloop, answering 200 "ok") runs in its own process on a free port of
127.0.0.1; every figure includes it, on the same 2 cores.

(a) **Clients**: ``--requests`` POSTs of a 300-byte event, ``--concurrency`` at a time over a
keep-alive pool, with aiohttp and with httpx (AsyncClient, HTTP/1.1), interleaved per round;
median requests/s.

(b) **Director**: the same number of jobs added to an empty JobDB of each backend, then delivered
by :class:`exactly.delivery.director.Director` (``max_in_flight`` = ``--concurrency``) with every
transition recorded (executing, then the outcome); median deliveries/s beside the bare aiohttp
client's figure of the same round, and their ratio. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import free_port

from exactly.delivery import open_jobdb
from exactly.delivery.base import NewJob
from exactly.delivery.director import Director
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


def _serve(port: int) -> None:
    import uvloop
    from aiohttp import web

    async def ok(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
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


HEADERS = {"Content-Type": "application/json", "Idempotency-Key": "m" * 27}


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def client_rate(name: str, url: str, count: int, concurrency: int) -> float:
    client = {"aiohttp": _aiohttp, "httpx": _httpx}[name]
    return count / timed(lambda: asyncio.run(client(url, count, concurrency)))


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
            NewJob("web", "bench", url, PAYLOAD, f"m{i}", expire_at=time.time() + 3600)
            for i in range(count)
        ]
        for batch, start in enumerate(range(0, count, 10_000)):
            db.add(jobs[start : start + 10_000], query_id="bench", batch_id=batch)
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
        seconds = timed(lambda: director.run(until_drained=True))
        assert director.tallies["bench"].succeeded == count, director.tallies
        return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobdb", default="sqlite,postgresql,mysql")
    parser.add_argument("--clients", default="aiohttp,httpx")
    args = parser.parse_args()
    backends = [name for name in args.jobdb.split(",") if name]
    clients = args.clients.split(",")
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
    print(
        f"\n{platform.python_version()}, {os.cpu_count()} cores, {args.requests} requests, "
        f"concurrency {args.concurrency}, {args.rounds} rounds (medians)\n"
    )
    bare = statistics.median(rates.get("aiohttp", [float("nan")]))
    print("| what | requests/s | ratio to bare aiohttp |\n|---|---:|---:|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / bare:.2f} |")


if __name__ == "__main__":
    main()
