"""Real browsers (issue 11): headless Chromium loads analytics.js and the RudderStack JS SDK v3,
unmodified from npm, in a page on another origin than the collector, with the SDKs' settings URLs
pointed at the collector; every event lands once in ``raw``, intact."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.browser.sdks import CHROMIUM, chromium_missing, npm_missing, page_server
from tests.conftest import require
from tests.integration.collector_server import KEYS, Collector

ROUNDS = 4  # rounds of the five call types per page
CALLS = ("track", "page", "identify", "group", "alias")


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with Collector(tmp_path_factory.mktemp("browsers")) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require(chromium_missing())
    require(npm_missing())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    with page_server() as url:
        yield url


# what each SDK and mode must have used: the preflights and deliveries of issue 11
PATHS = {
    ("segment", "standard"): [
        ("/v1/projects/settings", "200"), ("/v1/t", "200"), ("/v1/t", "204"), ("/v1/i", "200"),
        ("/v1/p", "200"), ("/v1/g", "200"), ("/v1/a", "200"),
    ],
    ("segment", "batching"): [("/v1/projects/settings", "200"), ("/v1/b", "200")],
    ("rudderstack", "xhr"): [
        ("/sourceConfig", "200"), ("/v1/track", "200"), ("/v1/track", "204"),
        ("/v1/identify", "200"), ("/v1/page", "200"), ("/v1/group", "200"), ("/v1/alias", "200"),
    ],
    ("rudderstack", "beacon"): [("/sourceConfig", "200"), ("/beacon/v1/batch", "200")],
}  # fmt: skip


_REQUESTS = re.compile(r'exactly_collector_requests_total\{path="([^"]*)",status="(\d+)"\} (\S+)')


def requests_by_path(collector: Collector) -> dict[tuple[str, str], float]:
    """The collector's request counter per (path, status)."""
    text = httpx.get(f"{collector.url}/metrics").text
    found = {}
    for line in text.splitlines():
        match = re.match(
            r'exactly_collector_requests_total\{path="([^"]*)",status="(\d+)"\} (\S+)', line
        )
        if match:
            found[match[1], match[2]] = float(match[3])
    return found


def events_of_run(collector: Collector, run: str) -> list[dict[str, Any]]:
    found = []
    for record in collector.records():
        if run.encode() in record.value:
            found.append(json.loads(record.value))
    return found


def marker(event: dict[str, Any]) -> str:
    """Which call of the page an event is: its n ("track-3") or, for alias, its previousId."""
    if event["type"] == "alias":
        return "alias-" + event["previousId"].rsplit("-", 1)[1]
    fields = event.get("properties") or event.get("traits") or {}
    if event["type"] == "identify" and "n" not in fields:  # RudderStack: traits in the context
        fields = event["context"].get("traits", {})
    return str(fields["n"])


@pytest.mark.parametrize(
    ("sdk", "mode"),
    [
        ("segment", "standard"),
        ("segment", "batching"),
        ("rudderstack", "xhr"),
        ("rudderstack", "beacon"),
    ],
)
def test_browser_sdk_events_land_once_intact(
    collector: Collector, browser: Any, page_origin: str, sdk: str, mode: str
) -> None:
    run = uuid.uuid4().hex
    before = requests_by_path(collector)
    source = "web" if sdk == "segment" else "app"
    assert page_origin.rsplit(":", 1)[1] != str(collector.port)  # another origin
    context = browser.new_context()
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda message: console.append(f"{message.type}: {message.text}"))
    query = f"sdk={sdk}&mode={mode}&collector={collector.url}&key={KEYS[source]}&run={run}"
    page.goto(f"{page_origin}/page.html?{query}&count={ROUNDS}")
    page.wait_for_function("window.done || window.failed", timeout=30_000)
    failed = page.evaluate("window.failed")
    assert not failed, (failed, console)
    page_ids = page.evaluate("window.done")

    expected = {f"{kind}-{n}" for kind in CALLS for n in range(ROUNDS)}
    deadline = time.monotonic() + 30
    while True:
        events = events_of_run(collector, run)
        if {marker(event) for event in events} >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    time.sleep(1.0)  # any late resend would show now
    context.close()
    events = events_of_run(collector, run)
    markers = [marker(event) for event in events]
    assert sorted(markers) == sorted(expected), (sorted(set(expected) - set(markers)), console)
    assert len({event["messageId"] for event in events}) == len(events)
    if sdk == "segment":  # analytics.js tells the page each event's messageId
        assert set(page_ids) == {event["messageId"] for event in events}
    for event in events:
        assert event["sourceId"] == source
        assert event["context"]["library"]["name"]
        if event["type"] in ("track", "page", "group"):
            fields = event.get("properties") or event.get("traits")
            assert fields["run"] == run and fields["nested"] == {"list": [1, "two", None]}
        if event["type"] == "track":
            assert event["event"] == "Clicked"
        if event["type"] in ("identify", "alias"):
            assert event["userId"] == f"user-{run}"
    after = requests_by_path(collector)
    for path, status in PATHS[sdk, mode]:
        assert after.get((path, status), 0) > before.get((path, status), 0), (path, status, after)
