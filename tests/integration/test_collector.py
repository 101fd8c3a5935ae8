"""The collector over real HTTP on loopback: API, auth, limits, gzip, partial batches, skew."""

from __future__ import annotations

import gzip
import json
import time
import uuid
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from exactly.events import ksuid_time, partition_for
from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with Collector(tmp_path_factory.mktemp("collector")) as running:
        yield running


@pytest.fixture(scope="module")
def client(collector: Collector) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=collector.url, timeout=30) as http:
        yield http


def stored(collector: Collector) -> dict[str, dict[str, Any]]:
    """The events in ``raw`` by messageId (each must be there once), with their partition."""
    found: dict[str, dict[str, Any]] = {}
    for record in collector.records():
        event = json.loads(record.value)
        assert record.key is not None and record.key.decode() == event["messageId"]
        assert event["messageId"] not in found, "an event is in raw twice"
        found[event["messageId"]] = {**event, "_partition": record.partition}
    return found


def mid() -> str:
    return str(uuid.uuid4())


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


EVENTS: dict[str, dict[str, Any]] = {
    "track": {"event": "Order Completed", "properties": {"revenue": 12.5, "items": [1, 2]}},
    "identify": {"traits": {"email": "a@example.com"}},
    "page": {"name": "Home", "properties": {"path": "/"}},
    "screen": {"name": "Settings", "category": "app"},
    "group": {"groupId": "g-1", "traits": {"plan": "pro"}},
    "alias": {"previousId": "anon-1"},
}


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_each_single_event_endpoint_logs_the_event(
    kind: str, collector: Collector, client: httpx.Client
) -> None:
    message_id = mid()
    body = {"userId": "u-1", "messageId": message_id, **EVENTS[kind]}
    response = client.post(f"/v1/{kind}", json=body, auth=WEB)
    assert response.status_code == 200, response.text
    assert response.json() == {"success": True}
    event = stored(collector)[message_id]
    assert event["type"] == kind
    assert event["sourceId"] == "web"
    assert event["_partition"] == partition_for(message_id, 8)
    for name, value in EVENTS[kind].items():
        assert event[name] == value
    for name in ("receivedAt", "timestamp"):
        datetime.fromisoformat(event[name])


def test_batch_and_import_take_every_type(collector: Collector, client: httpx.Client) -> None:
    for path in ("/v1/batch", "/v1/import"):
        ids = {kind: mid() for kind in EVENTS}
        batch = [
            {"type": kind, "userId": "u-2", "messageId": ids[kind], **EVENTS[kind]}
            for kind in EVENTS
        ]
        response = client.post(path, json={"batch": batch}, auth=WEB)
        assert response.status_code == 200, response.text
        assert response.json() == {"success": True, "accepted": len(EVENTS)}
        found = stored(collector)
        assert {kind: found[ids[kind]]["type"] for kind in EVENTS} == {k: k for k in EVENTS}


def test_missing_message_id_gets_a_ksuid(collector: Collector, client: httpx.Client) -> None:
    marker = mid()
    response = client.post("/v1/track", json={"event": "x", "anonymousId": marker}, auth=WEB)
    assert response.status_code == 200
    (event,) = [e for e in stored(collector).values() if e.get("anonymousId") == marker]
    assert len(event["messageId"]) == 27
    assert abs(ksuid_time(event["messageId"]) - datetime.now(UTC)) < timedelta(minutes=5)


def test_write_key_in_body_and_integer_ids(collector: Collector, client: httpx.Client) -> None:
    message_id = mid()
    body = {"writeKey": KEYS["app"], "userId": 42, "event": "e", "messageId": message_id}
    assert client.post("/v1/track", json=body).status_code == 200
    event = stored(collector)[message_id]
    assert event["sourceId"] == "app" and event["userId"] == "42"
    assert "writeKey" not in event


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({}, {"event": "e", "userId": "u"}),
        ({"Authorization": "Basic " + "bm9wZTo="}, {"event": "e", "userId": "u"}),  # nope:
        ({"Authorization": "Bearer abc"}, {"event": "e", "userId": "u"}),
        ({"Authorization": "Basic !!!"}, {"event": "e", "userId": "u"}),
        ({}, {"event": "e", "userId": "u", "writeKey": "wrong"}),
        ({}, {"event": "e", "userId": "u", "writeKey": 7}),
    ],
)
def test_missing_or_unknown_write_key_is_401(
    headers: dict[str, str], body: dict[str, Any], client: httpx.Client
) -> None:
    response = client.post("/v1/track", json=body, headers=headers)
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert KEYS["web"] not in response.text


def test_gzip_bodies(collector: Collector, client: httpx.Client) -> None:
    ids = [mid(), mid()]
    batch = [{"type": "track", "event": "z", "userId": "u", "messageId": i} for i in ids]
    body = gzip.compress(json.dumps({"batch": batch}).encode())
    response = client.post(
        "/v1/batch", content=body, headers={"Content-Encoding": "gzip"}, auth=WEB
    )
    assert response.status_code == 200, response.text
    deflated = zlib.compress(json.dumps({"event": "z", "userId": "u", "messageId": mid()}).encode())
    response = client.post(
        "/v1/track", content=deflated, headers={"Content-Encoding": "deflate"}, auth=WEB
    )
    assert response.status_code == 200, response.text
    assert set(ids) <= set(stored(collector))


@pytest.mark.parametrize(
    ("content", "encoding", "status", "code"),
    [
        (b"\x1f\x8b\x08\x00garbage", "gzip", 400, "invalid_encoding"),
        (gzip.compress(b'{"event": "e"}', mtime=0)[:-6], "gzip", 400, "invalid_encoding"),
        (b'{"event": "e", "userId": "u"}', "br", 415, "unsupported_encoding"),
        (b'{"event": ', None, 400, "invalid_json"),
        (b"[1, 2]", None, 400, "invalid_json"),
        (b"\xff\xfe", None, 400, "invalid_json"),
        (b'{"event": "e"}', None, 400, "missing_field"),
        (b'{"event": "", "userId": "u"}', None, 400, "missing_field"),
        (b'{"event": "e", "userId": "u", "properties": []}', None, 400, "invalid_field"),
        (b'{"event": "e", "userId": "u", "timestamp": "yesterday"}', None, 400,
         "invalid_timestamp"),
    ],
)  # fmt: skip
def test_bad_requests_are_4xx_with_a_json_reason(
    content: bytes, encoding: str | None, status: int, code: str, client: httpx.Client
) -> None:
    headers = {"Content-Encoding": encoding} if encoding else {}
    response = client.post("/v1/track", content=content, headers=headers, auth=WEB)
    assert response.status_code == status, response.text
    document = response.json()
    assert document["success"] is False and document["code"] == code and document["message"]


def test_size_limits(client: httpx.Client) -> None:
    big_event = {"event": "e", "userId": "u", "properties": {"blob": "x" * 33_000}}
    response = client.post("/v1/track", json=big_event, auth=WEB)
    assert response.status_code == 413 and response.json()["code"] == "too_large"

    huge = {"batch": [{"type": "track", "event": "e", "userId": "u", "p": "y" * 1000}] * 520}
    response = client.post("/v1/batch", json=huge, auth=WEB)
    assert response.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        yield b'{"batch": ['
        for n in range(600):
            if n > 520:  # still sending when the collector refuses: the 413 must still arrive
                time.sleep(0.002)
            yield b'{"type": "track", "event": "e", "userId": "u", "p": "' + b"z" * 1000 + b'"},'
        yield b"{}]}"

    response = client.post("/v1/batch", content=chunks(), auth=WEB)
    assert response.status_code == 413

    bomb = gzip.compress(b" " * (20 * 1024 * 1024))  # 20 KB that inflate to 20 MB
    response = client.post(
        "/v1/batch", content=bomb, headers={"Content-Encoding": "gzip"}, auth=WEB
    )
    assert response.status_code == 413


def test_the_connection_outlives_a_refused_body(client: httpx.Client) -> None:
    # the collector reads and drops the rest of a refused body, so the kept-alive connection
    # is still good for the next request (else the client's next request on it would fail)
    huge = {"batch": [{"type": "track", "event": "e", "userId": "u", "p": "y" * 1000}] * 520}
    for _ in range(20):
        assert client.post("/v1/batch", json=huge, auth=WEB).status_code == 413
        assert client.get("/health").status_code == 200
    # a body too big to drain closes the connection, and says so: the client opens a new one.
    # The answer must reach a client still sending (8 tries in 100 were reset before the
    # collector's lingering close), so this is tried 30 times.
    enormous = b"x" * (8 << 20)
    for _ in range(30):
        response = client.post("/v1/batch", content=enormous, auth=WEB)
        assert response.status_code == 413 and response.headers["connection"] == "close"
        assert client.get("/health").status_code == 200


def test_a_batch_takes_the_valid_events_and_names_the_others(
    collector: Collector, client: httpx.Client
) -> None:
    good = [mid(), mid()]
    batch: list[Any] = [
        {"type": "track", "event": "ok", "userId": "u", "messageId": good[0]},
        {"type": "track", "userId": "u", "messageId": "bad-1"},
        "not an object",
        {"type": "unknown", "userId": "u"},
        {"type": "track", "event": "big", "userId": "u", "p": "x" * 40_000},
        {"type": "identify", "anonymousId": "a", "messageId": good[1]},
    ]
    response = client.post("/v1/batch", json={"batch": batch}, auth=WEB)
    assert response.status_code == 200, response.text
    document = response.json()
    assert document["accepted"] == 2
    rejected = {r["index"]: r for r in document["rejected"]}
    assert set(rejected) == {1, 2, 3, 4}
    assert rejected[1]["messageId"] == "bad-1" and rejected[1]["code"] == "missing_field"
    assert rejected[2]["code"] == "not_an_object"
    assert rejected[3]["code"] == "invalid_type"
    assert rejected[4]["code"] == "too_large"
    found = stored(collector)
    assert set(good) <= set(found) and "bad-1" not in found

    response = client.post("/v1/batch", json={"batch": batch[1:5]}, auth=WEB)
    assert response.status_code == 400
    assert response.json()["code"] == "no_valid_events"
    assert len(response.json()["rejected"]) == 4

    for empty in ({"batch": []}, {"batch": {}}, {}):
        assert client.post("/v1/batch", json=empty, auth=WEB).status_code == 400


def test_clock_skew_is_corrected_from_sent_at(collector: Collector, client: httpx.Client) -> None:
    """The client's clock is 1 h behind: its timestamp is moved by the gap sentAt - receivedAt."""
    now = datetime.now(UTC)
    skew = timedelta(hours=1)
    ids = [mid(), mid(), mid()]
    events = [
        {"type": "track", "event": "e", "userId": "u", "messageId": ids[0],
         "timestamp": iso(now - skew - timedelta(seconds=30))},
        {"type": "track", "event": "e", "userId": "u", "messageId": ids[1]},
        {"type": "track", "event": "e", "userId": "u", "messageId": ids[2],
         "timestamp": "2024-03-01T10:00:00+02:00", "sentAt": "2024-03-01T10:00:00+02:00"},
    ]  # fmt: skip
    body = {"batch": events, "sentAt": iso(now - skew)}
    assert client.post("/v1/batch", json=body, auth=WEB).status_code == 200
    found = stored(collector)
    first = found[ids[0]]
    received = datetime.fromisoformat(first["receivedAt"])
    corrected = datetime.fromisoformat(first["timestamp"])
    assert abs(corrected - (received - timedelta(seconds=30))) < timedelta(milliseconds=2)
    assert first["originalTimestamp"] == events[0]["timestamp"]
    assert first["sentAt"] == body["sentAt"]
    assert found[ids[1]]["timestamp"] == found[ids[1]]["receivedAt"]  # no timestamp sent
    assert found[ids[2]]["timestamp"] == found[ids[2]]["receivedAt"]  # its own sentAt, no skew


def test_batch_context_is_merged_under_the_events(
    collector: Collector, client: httpx.Client
) -> None:
    ids = [mid(), mid()]
    body = {
        "context": {"library": {"name": "lib"}, "ip": "10.0.0.1"},
        "integrations": {"All": False},
        "batch": [
            {"type": "track", "event": "e", "userId": "u", "messageId": ids[0]},
            {"type": "track", "event": "e", "userId": "u", "messageId": ids[1],
             "context": {"ip": "10.0.0.2"}},
        ],
    }  # fmt: skip
    assert client.post("/v1/batch", json=body, auth=WEB).status_code == 200
    found = stored(collector)
    assert found[ids[0]]["context"] == {"library": {"name": "lib"}, "ip": "10.0.0.1"}
    assert found[ids[1]]["context"] == {"library": {"name": "lib"}, "ip": "10.0.0.2"}
    assert found[ids[1]]["integrations"] == {"All": False}


def test_routes_methods_health_metrics_openapi(client: httpx.Client) -> None:
    assert client.get("/health").json()["status"] == "ok"
    response = client.get("/nope")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    response = client.get("/v1/track")
    assert response.status_code == 405 and response.headers["allow"] == "POST, OPTIONS"
    assert client.post("/health").status_code == 405
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {"/v1/track", "/v1/batch", "/v1/import", "/health", "/metrics"} <= set(document["paths"])
    client.post("/v1/track", json={"event": "m", "userId": "u"}, auth=WEB)
    client.post("/v1/track", json={"userId": "u"}, auth=WEB)
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'exactly_collector_requests_total{path="/v1/track",status="200"}' in text
    assert 'exactly_collector_events_accepted_total{source="web"}' in text
    assert 'exactly_collector_events_rejected_total{reason="missing_field"}' in text
    assert "exactly_collector_append_seconds_bucket" in text
    assert "exactly_collector_queue_bytes" in text
    assert KEYS["web"] not in text


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    """With the smallest queue and a burst of large batches, some wait and some are refused."""
    import concurrent.futures

    with Collector(tmp_path, args=("--max-queue-mb", "1")) as small:
        event = {"type": "track", "event": "e", "userId": "u", "p": "q" * 2000}
        body = {"batch": [event] * 200}

        def send(_: int) -> httpx.Response:
            return httpx.post(f"{small.url}/v1/batch", json=body, auth=WEB, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(send, range(48)))
        statuses = {r.status_code for r in responses}
        assert statuses <= {200, 503}
        refused = [r for r in responses if r.status_code == 503]
        assert refused, "16 concurrent 440 KB batches should overflow a 1 MB queue"
        assert refused[0].headers["retry-after"] == "1"
        assert refused[0].headers["access-control-allow-origin"] == "*"  # a page can read it
        assert refused[0].headers["access-control-expose-headers"] == "retry-after"
        assert refused[0].json()["code"] == "queue_full"
        accepted = sum(r.json()["accepted"] for r in responses if r.status_code == 200)
        assert len(small.records()) == accepted


@pytest.mark.kafka
def test_the_collector_on_a_kafka_log(kafka_url: str, tmp_path: Path) -> None:
    """The same path with the Kafka-protocol broker as the log (acks=all before the 200)."""
    topic = f"raw-{uuid.uuid4().hex[:8]}"
    with Collector(tmp_path, log_url=kafka_url, topic=topic) as on_kafka:
        ids = [mid() for _ in range(50)]
        batch = [{"type": "track", "event": "k", "userId": "u", "messageId": i} for i in ids]
        response = httpx.post(f"{on_kafka.url}/v1/batch", json={"batch": batch}, auth=WEB)
        assert response.status_code == 200, response.text
        single = httpx.post(
            f"{on_kafka.url}/v1/identify", json={"userId": "u", "messageId": "k-1"}, auth=WEB
        )
        assert single.status_code == 200
        found = stored(on_kafka)
    assert set(ids) | {"k-1"} == set(found)
    assert all(found[i]["_partition"] == partition_for(i, 8) for i in ids)
