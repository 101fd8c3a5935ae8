"""Connection floods on a real collector (issue 11): with its defaults, 2,000 idle connections
used to stop `exactly collect` from answering (a real request timed out after 30 s). Now a real
request is answered within a second while 2,000 idle and 200 slow connections are open; idle ones
are closed after ``idle_timeout``, slow bodies get 408, memory stays bounded, the log unchanged."""

from __future__ import annotations

import resource
import socket
import time
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.collector_server import KEYS, Collector, basic

IDLE = 2000
SLOW = 200
WEB = basic(KEYS["web"])
SLOW_HEAD = (
    b"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\nAuthorization: Basic "
    + b64encode(KEYS["web"].encode() + b":")
    + b"\r\n\r\n{"
)  # a body that stops after its first byte


@pytest.fixture
def enough_files() -> Iterator[None]:
    """This process opens 2,200 sockets: raise its own open-file limit for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IDLE + SLOW + 1000
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.fail(f"the open-file hard limit ({hard}) is below {wanted}: raise it (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def timed_track(collector: Collector) -> tuple[float, str]:
    message_id = str(uuid.uuid4())
    started = time.perf_counter()
    response = httpx.post(
        f"{collector.url}/v1/track",
        json={"event": "e", "userId": "u", "messageId": message_id},
        auth=WEB,
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return time.perf_counter() - started, message_id


def closed_by_server(sock: socket.socket) -> bytes | None:
    """What the server sent before closing ``sock`` (None while it is still open)."""
    sock.setblocking(False)
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    return data


def test_a_real_request_is_answered_within_a_second_during_a_flood(
    tmp_path: Path, enough_files: None
) -> None:
    env = {"EXACTLY_COLLECTOR__IDLE_TIMEOUT": "3", "EXACTLY_COLLECTOR__READ_TIMEOUT": "3"}
    sockets: list[socket.socket] = []
    with Collector(tmp_path, env=env) as collector:
        before_rss = collector.rss_mb()
        before = len(collector.records())
        try:
            opened = time.monotonic()
            for _ in range(IDLE):
                sockets.append(socket.create_connection(("127.0.0.1", collector.port), timeout=5))
            slow = []
            for _ in range(SLOW):
                sock = socket.create_connection(("127.0.0.1", collector.port), timeout=5)
                sock.sendall(SLOW_HEAD)
                slow.append(sock)
            sockets += slow
            took, sent = zip(*(timed_track(collector) for _ in range(5)), strict=True)
            assert time.monotonic() - opened < 2.5, "the flood outlived the idle timeout"
            assert max(took) < 1.0, took
            during_rss = collector.rss_mb()

            time.sleep(5)  # past idle_timeout and read_timeout (3 s)
            idle_left = sum(closed_by_server(sock) is None for sock in sockets[:IDLE])
            assert idle_left == 0, f"{idle_left} idle connections are still open"
            answers = [closed_by_server(sock) for sock in slow]
            assert all(answer and answer.startswith(b"HTTP/1.1 408") for answer in answers), {
                answer[:40] if answer else answer for answer in answers
            }
        finally:
            for sock in sockets:
                sock.close()
        assert timed_track(collector)[0] < 1.0
        after = collector.records()
    print(f"answered in {max(took):.3f} s at most; RSS {before_rss:.0f} -> {during_rss:.0f} MB")
    assert during_rss - before_rss < 150, (before_rss, during_rss)
    assert len(after) == before + len(sent) + 1  # the slow bodies appended nothing
