"""The Node SDKs, unmodified from npm (@segment/analytics-node, @rudderstack/rudder-sdk-node):
every call type lands in ``raw`` once, with the messageId the SDK sent."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.browser.sdks import HERE, npm_missing
from tests.conftest import require
from tests.integration.collector_server import KEYS, Collector


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    require(npm_missing())
    with Collector(tmp_path_factory.mktemp("node-sdks")) as running:
        yield running


@pytest.mark.parametrize(("sdk", "source"), [("segment", "web"), ("rudderstack", "app")])
def test_node_sdk_calls_land_once_with_their_message_ids(
    collector: Collector, sdk: str, source: str
) -> None:
    run = uuid.uuid4().hex
    done = subprocess.run(
        ["node", "node_sdks.js", sdk, collector.url, KEYS[source], run],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    sent = json.loads(done.stdout.strip().splitlines()[-1])["sent"]
    assert [call["type"] for call in sent] == [
        "track", "identify", "page", "screen", "group", "alias",
    ]  # fmt: skip
    stored: dict[str, list[dict[str, object]]] = {}
    for record in collector.records():
        event = json.loads(record.value)
        stored.setdefault(str(event["messageId"]), []).append(event)
    for call in sent:
        found = stored.get(call["messageId"], [])
        assert len(found) == 1, (call, len(found))
        event = found[0]
        assert event["type"] == call["type"] and event["sourceId"] == source
        assert event["userId"] == f"user-{run}"
    by_type = {call["type"]: stored[call["messageId"]][0] for call in sent}
    assert by_type["track"]["event"] == "Order Completed"
    assert by_type["track"]["properties"] == {
        "run": run, "revenue": 9.99, "nested": {"list": [1, "two", None]},
    }  # fmt: skip
    assert by_type["group"]["groupId"] == f"group-{run}"
    assert by_type["alias"]["previousId"] == f"anon-{run}"
