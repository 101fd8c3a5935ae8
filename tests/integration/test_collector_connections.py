"""Connections per client address (issue 33, item 3): the connection front in front of granian
(``[collector] max_connections_per_address``, 256 by default) holds at most that many per
address, the least recently active closed first, and the limits still see each client's own
address behind it."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])
ROOT = Path(__file__).resolve().parents[2]


def health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return sock.recv(4096)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def track(url: str, source: str, *, batch: int = 1) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        events = [
            {"type": "track", "event": "e", "userId": "u", "messageId": str(uuid.uuid4())}
            for _ in range(batch)
        ]
        return client.post(f"{url}/v1/batch", json={"batch": events}, auth=WEB)


def test_the_257th_connection_of_an_address_closes_its_least_recently_active(
    tmp_path: Path,
) -> None:
    with Collector(tmp_path) as collector:
        sockets = [socket.create_connection(("127.0.0.1", collector.port)) for _ in range(256)]
        try:
            time.sleep(0.3)  # all admitted, in this order
            assert b" 200 " in health(sockets[0])  # the first is now the most recently active
            newest = socket.create_connection(("127.0.0.1", collector.port))
            sockets.append(newest)
            assert closed_within(sockets[1], 3), "the least recently active was not closed"
            assert not closed_within(sockets[2], 0.2)
            assert b" 200 " in health(sockets[0])
            assert b" 200 " in health(newest)
            other = socket.create_connection(
                ("127.0.0.1", collector.port), source_address=("127.0.0.2", 0)
            )
            sockets.append(other)
            assert b" 200 " in health(other)  # another address has its own 256
            assert not closed_within(sockets[3], 0.2)
        finally:
            for sock in sockets:
                sock.close()


@pytest.mark.parametrize("per_address", ["256", "0"], ids=["front", "direct"])
def test_limits_see_each_client_address(tmp_path: Path, per_address: str) -> None:
    env = {
        "EXACTLY_COLLECTOR__MAX_CONNECTIONS_PER_ADDRESS": per_address,
        # a request per 100 s once the burst of two is spent: at 1 a second, three requests
        # that took over a second under load (the test suite beside them) all passed
        "EXACTLY_COLLECTOR__RATE_LIMITS": '{"web": 0.01}',
        "EXACTLY_COLLECTOR__RATE_LIMIT_BURST": "2",
        "EXACTLY_COLLECTOR__BYTE_LIMITS": '{"app": 1000}',
    }
    with Collector(tmp_path, env=env) as collector:
        url = collector.url
        statuses = [track(url, "127.0.0.1").status_code for _ in range(3)]
        assert statuses == [200, 200, 429]
        assert track(url, "127.0.0.2").status_code == 200  # not the first client's bucket
        app = basic(KEYS["app"])
        stored = []
        for source in ("127.0.0.1", "127.0.0.1", "127.0.0.3"):
            transport = httpx.HTTPTransport(local_address=source)
            with httpx.Client(transport=transport, timeout=30) as client:
                events = [
                    {
                        "type": "track",
                        "event": "e",
                        "userId": "u",
                        "messageId": str(uuid.uuid4()),
                        "properties": {"p": "x" * 500},
                    }
                    for _ in range(100)
                ]  # about 60 KB as stored: the first fits the 64 KiB burst, the second not
                response = client.post(f"{url}/v1/batch", json={"batch": events}, auth=app)
                stored.append(response.status_code)
        assert stored == [200, 429, 200], stored


@pytest.mark.slow
def test_one_address_holding_11000_sockets_leaves_others_answered(tmp_path: Path) -> None:
    with Collector(tmp_path) as collector:
        holder = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.socket_holder", "127.0.0.1",
             str(collector.port), "11000", "127.0.0.1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            time.sleep(2)
            took = []
            for _ in range(20):
                started = time.perf_counter()
                assert track(collector.url, "127.0.0.2").status_code == 200
                took.append(time.perf_counter() - started)
                time.sleep(0.5)
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            reopened = int(holder.stdout.readline() or 0) if holder.stdout else 0
            holder.wait(timeout=30)
    print(f"127.0.0.2: median {statistics.median(took):.3f} s, max {max(took):.3f} s; "
          f"127.0.0.1 reopened {reopened:,} sockets")  # fmt: skip
    # the defect made every request from another address take 3-5 s. Issue 33's target is under
    # 1 s; this test shares the machine's two cores with two Spark crash tests (three xdist
    # workers), where a few requests of 20 took 1.4-1.7 s at load 15 (CI on 2026-11-29): so the
    # median is held to the target and all but two requests to under 3 s
    assert statistics.median(took) < 1.0 and sorted(took)[-3] < 3.0, took
    assert reopened >= 11000 - 256, "the holder's sockets were not closed by the collector"


def test_the_collector_stops_and_says_so_when_its_front_dies(tmp_path: Path) -> None:
    collector = Collector(tmp_path)
    collector.start()
    try:
        assert collector.process is not None
        front = [
            int(pid)
            for pid in filter(str.isdigit, os.listdir("/proc"))
            if os.getpgid(int(pid)) == collector.process.pid
            and b"exactly.collector.front" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(front) == 1
        os.kill(front[0], signal.SIGKILL)
        assert collector.process.wait(timeout=30) is not None
        assert "the connection front exited" in collector.tail()
    finally:
        collector.kill()
