"""Amplified bytes (issue 33, item 2): a 939-byte gzip body used to append 7.95 MB (its batch
context copied into each of its events), and one client grew the data dir by 863 MB in 10 s,
547 MB with ``rate_limits web = 5``, since limits counted requests. Now a request stores at most
``max_expansion`` (100) times what it sent (413 naming the limit), and ``[collector.byte_limits]``
bounds the stored bytes per second of one client address (429 with Retry-After)."""

from __future__ import annotations

import gzip
import os
import time
import uuid
from pathlib import Path

import httpx
import orjson
import pytest

from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])


def amplified(events: int, context_bytes: int, random: bool = False) -> bytes:
    """A small gzip body whose batch context is copied into every event."""
    padding = os.urandom(context_bytes // 2).hex() if random else "x" * context_bytes
    document = {
        "context": {"padding": padding},
        "batch": [{"type": "track", "event": "e", "userId": "u"} for _ in range(events)],
    }
    return gzip.compress(orjson.dumps(document), 9)


def stored_bytes(collector: Collector) -> int:
    return sum(len(r.key or b"") + len(r.value) for r in collector.records())


def test_a_request_that_expands_past_max_expansion_gets_413_and_stores_nothing(
    tmp_path: Path,
) -> None:
    body = amplified(250, 30_000)
    assert len(body) < 1500
    with Collector(tmp_path) as collector:
        refused = httpx.post(
            f"{collector.url}/v1/batch",
            content=body,
            headers={"content-encoding": "gzip", "content-type": "application/json"},
            auth=WEB,
        )
        assert refused.status_code == 413, refused.text[:300]
        assert "collector.max_expansion" in refused.json()["message"]
        assert collector.records() == []
        # an SDK batch that compresses well (about 20 times) is taken
        batch = [
            {"type": "track", "event": "Order Completed", "userId": f"user-{i}",
             "messageId": str(uuid.uuid4()), "properties": {"total": i, "currency": "EUR"}}
            for i in range(300)
        ]  # fmt: skip
        ordinary = gzip.compress(orjson.dumps({"batch": batch}))
        taken = httpx.post(
            f"{collector.url}/v1/batch",
            content=ordinary,
            headers={"content-encoding": "gzip", "content-type": "application/json"},
            auth=WEB,
        )
        assert taken.status_code == 200, taken.text[:300]
        assert len(collector.records()) == 300


@pytest.mark.slow
def test_one_client_stores_no_more_than_its_byte_limit(tmp_path: Path) -> None:
    """10 s of amplified requests (each within max_expansion) from one client, with a byte limit
    of 1 MB/s: at most its 10 s burst plus 10 s at its rate are stored."""
    rate = 1_000_000
    env = {"EXACTLY_COLLECTOR__BYTE_LIMITS": orjson.dumps({"web": rate}).decode()}
    body = amplified(40, 2_000, random=True)  # ~100 KB stored per ~1.2 KB sent: under 100x
    seconds = 10.0
    statuses: dict[int, int] = {}
    with Collector(tmp_path, env=env) as collector:
        began = time.monotonic()
        with httpx.Client(auth=WEB, timeout=30) as client:
            while time.monotonic() - began < seconds:
                response = client.post(
                    f"{collector.url}/v1/batch",
                    content=body,
                    headers={"content-encoding": "gzip", "content-type": "application/json"},
                )
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 429:
                    assert int(response.headers["retry-after"]) >= 1
                    assert response.json()["code"] == "byte_limited"
        elapsed = time.monotonic() - began
        stored = stored_bytes(collector)
    print(f"{statuses}; stored {stored / 1e6:.1f} MB in {elapsed:.1f} s")
    assert statuses.get(429, 0) > 0, statuses
    assert set(statuses) <= {200, 429}, statuses
    assert stored <= 10 * rate + elapsed * rate + 100_000, stored
