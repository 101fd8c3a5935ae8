"""Delivery to a receiver that throttles a share of its requests, against one that does not.

    .venv/bin/python bench/throttled.py [--seconds 20] [--rounds 3] [--max-in-flight 16]
                                        [--throttled 0.05] [--failing 0.20]

A fast receiver in its own process (a raw asyncio protocol on uvloop, as ``bench/delivery.py``'s)
answers each request, drawn at random, ``429`` with ``Retry-After: 1`` (a ``--throttled`` share),
``500`` (a ``--failing`` share), else ``200``. A :class:`~exactly.delivery.director.Director`
delivers from a SQLite JobDB holding more jobs than it can send in ``--seconds`` (``--jobs``),
``--max-in-flight`` at a time, with the destination's default retry policy, and is stopped after
``--seconds``: the deliveries/s are the jobs that succeeded over that time (steady sending; a
drain's end would be the retries' backoff, 5 s doubling, not the sending).
Each round runs the same director twice, interleaved: against the receiver with both shares
(**throttled**), and with the 500s only (**baseline**); the ratio of the medians is what issue 45
asks to be at least 0.5. Prints the machine, the load before and after, each round and the
medians, and how many requests each answer got.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import free_port

from exactly.delivery.director import Director
from exactly.delivery.jobdb import open_jobdb
from exactly.delivery.jobdb.base import NewJob
from exactly.delivery.settings import DestinationSettings

PAYLOAD = b'{"messageId":"m","type":"track","event":"Order Completed","properties":{"n":1}}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
THROTTLED = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nslow"
FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 5\r\n\r\nagain"


class _Answer(asyncio.Protocol):
    """Reads HTTP/1.1 requests (headers and a Content-Length body) and answers each at random."""

    def __init__(self, throttled: float, failing: float, counts: dict[bytes, int]) -> None:
        self.throttled, self.failing, self.counts = throttled, failing, counts
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data
        out = []
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buffer[:end].lower()
            at = head.find(b"content-length:")
            length = 0 if at < 0 else int(head[at + 15 : head.find(b"\r\n", at) % (end + 1)])
            if len(buffer) < end + 4 + length:
                break
            buffer = buffer[end + 4 + length :]
            draw = random.random()
            if draw < self.throttled:
                answer = THROTTLED
            elif draw < self.throttled + self.failing:
                answer = FAILED
            else:
                answer = OK
            self.counts[answer[9:12]] = self.counts.get(answer[9:12], 0) + 1
            out.append(answer)
        self.buffer = buffer
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


def _serve(port: int, throttled: float, failing: float, counts: Any) -> None:
    """The receiver process: serves until killed, copying its counts to ``counts`` (a
    manager's dict) five times a second."""
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        seen: dict[bytes, int] = {}
        await loop.create_server(
            lambda: _Answer(throttled, failing, seen), "127.0.0.1", port, backlog=1024
        )
        while True:
            await asyncio.sleep(0.2)
            counts.update(seen)

    uvloop.run(serve())


@contextmanager
def receiver(throttled: float, failing: float, answers: dict[bytes, int]) -> Iterator[str]:
    """The receiver's URL; on leaving, the requests each answer got are added to ``answers``."""
    port = free_port()
    spawn = multiprocessing.get_context("spawn")
    with spawn.Manager() as manager:
        counts = manager.dict()
        process = spawn.Process(target=_serve, args=(port, throttled, failing, counts))
        process.start()
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
            time.sleep(0.5)  # the receiver's last counts
            for status, count in dict(counts).items():
                answers[status] = answers.get(status, 0) + count
            process.kill()
            process.join()


def deliver(url: str, jobs: int, max_in_flight: int, seconds: float) -> float:
    """Deliveries/s of a director sending for ``seconds`` from a SQLite JobDB of ``jobs``."""
    target = DestinationSettings(
        name="bench",
        url=url,
        secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        max_in_flight=max_in_flight,
    )
    with (
        tempfile.TemporaryDirectory() as directory,
        open_jobdb(f"sqlite://{Path(directory) / 'jobdb'}") as db,
    ):
        expire = time.time() + 3600
        for batch, start in enumerate(range(0, jobs, 10_000)):
            db.add(
                [
                    NewJob("web", "bench", PAYLOAD, f"m{n}", expire_at=expire)
                    for n in range(start, min(jobs, start + 10_000))
                ],
                query_id="bench",
                batch_id=batch,
            )
        director = Director(db, [target], poll_seconds=0.05, report=lambda _: None)
        runner = threading.Thread(target=director.run)
        began = time.perf_counter()
        runner.start()
        time.sleep(seconds)
        succeeded = director.tallies["bench"].succeeded
        took = time.perf_counter() - began
        director.stop()
        runner.join()
    assert succeeded < jobs, "the director ran out of jobs: raise --jobs"
    return succeeded / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument("--throttled", type=float, default=0.05)
    parser.add_argument("--failing", type=float, default=0.20)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    ways = {"throttled": args.throttled, "baseline": 0.0}
    rates: dict[str, list[float]] = {way: [] for way in ways}
    answers: dict[str, dict[bytes, int]] = {way: {} for way in ways}
    for _ in range(args.rounds):
        for way, share in ways.items():
            with receiver(share, args.failing, answers[way]) as url:
                rates[way].append(deliver(url, args.jobs, args.max_in_flight, args.seconds))
    print(f"load after {os.getloadavg()[0]:.1f}")
    print(
        f"\n{args.seconds:.0f} s of sending, max_in_flight {args.max_in_flight}, "
        f"500 to {args.failing:.0%}"
    )
    print("\n| receiver | deliveries/s (rounds) | median | answers (200 / 429 / 500) |")
    print("| --- | --- | ---: | --- |")
    for way, found in rates.items():
        runs = ", ".join(f"{rate:,.0f}" for rate in found)
        seen = answers[way]
        counted = " / ".join(f"{seen.get(code, 0):,}" for code in (b"200", b"429", b"500"))
        label = f"429 to {ways[way]:.0%}" if ways[way] else "no 429"
        print(f"| {label} | {runs} | {statistics.median(found):,.0f} | {counted} |")
    ratio = statistics.median(rates["throttled"]) / statistics.median(rates["baseline"])
    print(f"\nthrottled / baseline: {ratio:.2f}")


if __name__ == "__main__":
    main()
