"""Issue 11's list of hostile input, one request each on a real collector: a clear 4xx, the
server still answering, its memory bounded, and nothing written to the log."""

from __future__ import annotations

import gzip
import socket
import time
from base64 import b64encode
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])
AUTH = b"Authorization: Basic " + b64encode(KEYS["web"].encode() + b":")
BOMB = gzip.compress(bytes(300 * 2**20), 9)  # 300 MB of zeros in about 300 KB


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    env = {"EXACTLY_COLLECTOR__READ_TIMEOUT": "2"}
    with Collector(tmp_path_factory.mktemp("inputs"), env=env) as running:
        yield running


CASES: dict[str, tuple[str, bytes, dict[str, str], int, str]] = {
    # name: (path, body, headers, status, code)
    "gzip bomb": ("/v1/track", BOMB, {"Content-Encoding": "gzip"}, 413, "too_large"),
    "100,000-deep JSON": ("/v1/track", b"[" * 100_000 + b"]" * 100_000, {}, 400, "invalid_json"),
    "deep inside an event": (
        "/v1/track",
        b'{"event":"e","userId":"u","properties":{"x":' + b"[" * 1000 + b"]" * 1000 + b"}}",
        {},
        400,
        "too_deep",
    ),
    "a huge array": ("/v1/batch", b"[" + b"0," * 200_000 + b"0]", {}, 400, "invalid_json"),
    "a batch of 60,000 empty events": (
        "/v1/batch",
        b'{"batch":[' + b",".join([b"{}"] * 60_000) + b"]}",
        {},
        400,
        "no_valid_events",
    ),
    "a NUL byte": ("/v1/track", b'{"event":"a\x00b","userId":"u"}', {}, 400, "invalid_json"),
    "invalid UTF-8": ("/v1/track", b'{"event":"\xff\xfe","userId":"u"}', {}, 400, "invalid_json"),
    "a lone surrogate": ("/v1/track", b'{"event":"\\ud800","userId":"u"}', {}, 400, "invalid_json"),
    # "track needs event, a non-empty string"
    "a number for a string": ("/v1/track", b'{"event":5,"userId":"u"}', {}, 400, "missing_field"),
    "an object for a string": (
        "/v1/track",
        b'{"event":{"a":1},"userId":"u"}',
        {},
        400,
        "missing_field",
    ),
    "an object for the userId": ("/v1/identify", b'{"userId":{"a":1}}', {}, 400, "invalid_field"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_bodies_get_a_clear_4xx_and_change_nothing(collector: Collector, case: str) -> None:
    path, body, headers, status, code = CASES[case]
    before, rss = len(collector.records()), collector.rss_mb()
    response = httpx.post(
        f"{collector.url}{path}", content=body, headers=headers, auth=WEB, timeout=30
    )
    assert response.status_code == status, response.text[:300]
    assert response.json()["code"] == code, response.text[:300]
    assert httpx.get(f"{collector.url}/health").json()["status"] == "ok"
    assert collector.rss_mb() - rss < 100, (rss, collector.rss_mb())
    assert len(collector.records()) == before


def raw_request(collector: Collector, head: bytes, body: bytes, wait: float = 5) -> bytes:
    """Send ``head`` and ``body`` as they are; what the server answers within ``wait`` s."""
    with socket.create_connection(("127.0.0.1", collector.port), timeout=wait) as sock:
        sock.sendall(head + b"\r\n" + AUTH + b"\r\n\r\n" + body)
        answer = b""
        deadline = time.monotonic() + wait
        while b"\r\n\r\n" not in answer and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("declared", "body", "status"),
    [
        (10, b'{"event":"e","userId":"u"}', b"400"),  # shorter than the body: cut JSON
        (1000, b'{"event":"e","userId":"u"}', b"408"),  # longer: the rest never comes
        (10**9, b"{}", b"413"),  # beyond the limit: refused before reading
    ],
    ids=["says-less", "says-more", "says-a-gigabyte"],
)
def test_bodies_that_lie_about_their_length(
    collector: Collector, declared: int, body: bytes, status: bytes
) -> None:
    before = len(collector.records())
    head = f"POST /v1/track HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}".encode()
    answer = raw_request(collector, head, body)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert httpx.get(f"{collector.url}/health").status_code == 200
    assert len(collector.records()) == before
