"""The official Segment and RudderStack Python SDKs, unmodified, pointed at a real collector."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.integration.collector_server import KEYS, Collector


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with Collector(tmp_path_factory.mktemp("sdks")) as running:
        yield running


def segment_client(url: str, gzip: bool) -> Any:
    from segment.analytics import Client

    return Client(KEYS["web"], host=url, gzip=gzip, max_retries=2, upload_interval=0.05)


def rudder_client(url: str, gzip: bool) -> Any:
    from rudderstack.analytics import Client

    return Client(KEYS["app"], host=url, gzip=gzip, max_retries=2, upload_interval=0.05)


SDKS: dict[str, tuple[Callable[[str, bool], Any], str]] = {
    "segment": (segment_client, "web"),
    "rudderstack": (rudder_client, "app"),
}


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_sdk_calls_land_in_raw_once_with_ids_and_properties(
    sdk: str, gzip: bool, collector: Collector
) -> None:
    make, source = SDKS[sdk]
    errors: list[Any] = []
    client = make(collector.url, gzip)
    client.on_error = lambda error, batch: errors.append(error)
    ids = {
        name: str(uuid.uuid4())
        for name in ("track", "identify", "page", "screen", "group", "alias")
    }
    user = f"user-{uuid.uuid4().hex[:8]}"
    properties = {"revenue": 9.99, "currency": "EUR", "nested": {"a": [1, "b", None]}}
    client.track(user, "Order Completed", properties, message_id=ids["track"])
    client.identify(user, {"email": "x@example.com", "age": 42}, message_id=ids["identify"])
    client.page(user, "Docs", "Getting started", {"path": "/docs"}, message_id=ids["page"])
    client.screen(user, "App", "Settings", {"tab": 2}, message_id=ids["screen"])
    client.group(user, "company-1", {"plan": "enterprise"}, message_id=ids["group"])
    client.alias("anonymous-7", user, message_id=ids["alias"])
    client.flush()
    client.shutdown()
    assert not errors, errors

    found: dict[str, list[dict[str, Any]]] = {}
    for record in collector.records():
        event = json.loads(record.value)
        found.setdefault(event["messageId"], []).append(event)
    events = {}
    for kind, message_id in ids.items():
        assert len(found.get(message_id, [])) == 1, (
            f"{kind} is in raw {len(found.get(message_id, []))} times"
        )
        events[kind] = found[message_id][0]
        assert events[kind]["type"] == kind
        assert events[kind]["sourceId"] == source
        assert events[kind]["userId"] == user
    assert events["track"]["event"] == "Order Completed"
    assert events["track"]["properties"] == properties
    identify = events["identify"]  # RudderStack's SDK sends identify traits in context.traits
    traits = identify["traits"] if sdk == "segment" else identify["context"]["traits"]
    assert traits == {"email": "x@example.com", "age": 42}
    assert events["page"]["name"] == "Getting started" and events["page"]["category"] == "Docs"
    assert events["page"]["properties"]["path"] == "/docs"
    assert events["screen"]["properties"]["tab"] == 2
    assert events["group"]["groupId"] == "company-1"
    assert events["group"]["traits"] == {"plan": "enterprise"}
    assert events["alias"]["previousId"] == "anonymous-7"
    assert events["track"]["context"]["library"]["name"]
