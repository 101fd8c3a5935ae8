"""Browser request shapes on a real collector (issue 11): CORS preflights and headers on every
answer, allowed origins per source, analytics.js's short paths, text/plain bodies, RudderStack's
sendBeacon path and the settings documents both SDKs fetch at load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli_text import said
from tests.integration.collector_server import KEYS, Collector, basic

WEB = basic(KEYS["web"])
PAGE = "http://page.example:8000"
SHOP = "https://shop.example"


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    # web takes any origin; app only pages on https://shop.example
    env = {"EXACTLY_COLLECTOR__ALLOWED_ORIGINS": json.dumps({"app": [SHOP + "/"]})}
    with Collector(tmp_path_factory.mktemp("cors"), env=env) as running:
        yield running


@pytest.fixture(scope="module")
def client(collector: Collector) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=collector.url, timeout=30) as http:
        yield http


def track(**fields: object) -> dict[str, object]:
    return {"type": "track", "event": "e", "userId": "u", "messageId": str(uuid.uuid4()), **fields}


def stored(collector: Collector) -> dict[str, list[dict[str, object]]]:
    found: dict[str, list[dict[str, object]]] = {}
    for record in collector.records():
        event = json.loads(record.value)
        found.setdefault(event["messageId"], []).append(event)
    return found


def preflight(client: httpx.Client, path: str, origin: str = PAGE, **extra: str) -> httpx.Response:
    headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-retry-count",
        **extra,
    }
    return client.options(path, headers=headers)


@pytest.mark.parametrize(
    "path",
    ["/v1/t", "/v1/i", "/v1/p", "/v1/s", "/v1/g", "/v1/a", "/v1/b", "/v1/m", "/v1/track",
     "/v1/batch", "/v1/import", "/beacon/v1/batch"],
)  # fmt: skip
def test_a_preflight_is_answered_before_the_method_check_and_auth(
    client: httpx.Client, path: str
) -> None:
    response = preflight(client, path)
    assert response.status_code == 204, response.text
    assert response.headers["access-control-allow-origin"] == PAGE
    assert response.headers["access-control-allow-credentials"] == "true"
    assert response.headers["vary"] == "origin"
    assert response.headers["access-control-allow-methods"] == "POST, OPTIONS"
    # echoed: "*" would not cover Authorization
    assert response.headers["access-control-allow-headers"] == (
        "authorization,content-type,x-retry-count"
    )
    assert int(response.headers["access-control-max-age"]) >= 600


def test_a_preflight_for_the_settings_documents_allows_get(client: httpx.Client) -> None:
    for path in (f"/v1/projects/{KEYS['web']}/settings", "/sourceConfig/"):
        response = preflight(client, path, **{"Access-Control-Request-Method": "GET"})
        assert response.status_code == 204
        assert response.headers["access-control-allow-methods"] == "GET, OPTIONS"


def test_odd_requested_headers_get_the_sdk_list_and_private_network_is_allowed(
    client: httpx.Client,
) -> None:
    response = preflight(
        client,
        "/v1/t",
        **{
            "Access-Control-Request-Headers": "bad header\tvalue;",
            "Access-Control-Request-Private-Network": "true",
        },
    )
    assert response.status_code == 204
    assert "authorization" in response.headers["access-control-allow-headers"]
    assert response.headers["access-control-allow-private-network"] == "true"


def test_every_answer_carries_the_cors_headers(client: httpx.Client) -> None:
    """Errors included: without them a page cannot read a 4xx and retries it forever."""
    origin = {"Origin": PAGE}
    answers = [
        client.post("/v1/t", json=track(), auth=WEB, headers=origin),  # 200
        client.post("/v1/t", content=b"{", auth=WEB, headers=origin),  # 400
        client.post("/v1/t", json=track(), headers=origin),  # 401
        client.post("/v1/t", json=track(), auth=("nope", ""), headers=origin),  # 401
        client.get("/v1/t", headers=origin),  # 405
        client.post("/v1/nope", headers=origin),  # 404
        client.options("/v1/nope", headers=origin),  # 404
        client.post("/v1/t", content=b"x" * 600_000, auth=WEB, headers=origin),  # 413
        client.get("/health", headers=origin),
    ]
    assert [a.status_code for a in answers] == [200, 400, 401, 401, 405, 404, 404, 413, 200]
    for answer in answers:
        assert answer.headers["access-control-allow-origin"] == PAGE, answer.request.url
        assert answer.headers["access-control-expose-headers"] == "retry-after"
    plain = client.post("/v1/t", json=track(), auth=WEB)  # not from a page: no Origin
    assert plain.headers["access-control-allow-origin"] == "*"


def test_allowed_origins_per_source(collector: Collector, client: httpx.Client) -> None:
    app = basic(KEYS["app"])
    taken, refused = track(), track()
    ok = client.post("/v1/t", json=taken, auth=app, headers={"Origin": SHOP})
    assert ok.status_code == 200, ok.text
    no = client.post("/v1/t", json=refused, auth=app, headers={"Origin": PAGE})
    assert no.status_code == 403 and no.json()["code"] == "origin_not_allowed"
    # the body's writeKey is judged the same way
    body = {**track(), "writeKey": KEYS["app"]}
    assert client.post("/v1/t", json=body, headers={"Origin": PAGE}).status_code == 403
    # without Origin (a server, not a page) the source takes it
    assert client.post("/v1/t", json=track(), auth=app).status_code == 200
    found = stored(collector)
    assert taken["messageId"] in found and refused["messageId"] not in found
    assert body["messageId"] not in found


def test_a_preflight_from_an_origin_no_source_takes_is_refused(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    env = {
        "EXACTLY_COLLECTOR__ALLOWED_ORIGINS": json.dumps({"web": [SHOP], "app": [SHOP]}),
    }
    with Collector(tmp_path_factory.mktemp("cors-closed"), env=env) as closed:
        response = preflight(httpx.Client(base_url=closed.url), "/v1/t", origin=PAGE)
        assert response.status_code == 403
        assert "access-control-allow-origin" not in response.headers
        response = preflight(httpx.Client(base_url=closed.url), "/v1/t", origin=SHOP)
        assert response.status_code == 204


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/v1/t", "track"), ("/v1/i", "identify"), ("/v1/p", "page"), ("/v1/s", "screen"),
     ("/v1/g", "group"), ("/v1/a", "alias")],
)  # fmt: skip
def test_short_paths_take_text_plain_with_the_write_key_inside(
    collector: Collector, client: httpx.Client, path: str, kind: str
) -> None:
    event = {
        "userId": "u", "previousId": "p", "groupId": "g", "event": "e",
        "messageId": str(uuid.uuid4()), "writeKey": KEYS["web"], "type": kind,
    }  # fmt: skip
    response = client.post(
        path, content=json.dumps(event), headers={"Content-Type": "text/plain", "Origin": PAGE}
    )
    assert response.status_code == 200, response.text
    [stored_event] = stored(collector)[event["messageId"]]
    assert stored_event["type"] == kind and stored_event["sourceId"] == "web"
    assert "writeKey" not in stored_event


def test_batch_short_path_and_metrics_are_taken(collector: Collector, client: httpx.Client) -> None:
    events = [track(), track()]
    response = client.post(
        "/v1/b",
        content=json.dumps({"batch": events, "writeKey": KEYS["web"]}),
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 200 and response.json()["accepted"] == 2
    before = len(collector.records())
    metrics = client.post("/v1/m", content=b'{"series":[]}', headers={"Content-Type": "text/plain"})
    assert metrics.status_code == 200
    assert len(collector.records()) == before  # discarded


def test_beacon_batch_with_the_write_key_in_the_query(
    collector: Collector, client: httpx.Client
) -> None:
    events = [track(), track()]
    response = client.post(
        f"/beacon/v1/batch?writeKey={KEYS['web']}",
        content=json.dumps({"batch": events, "sentAt": "2024-01-01T00:00:00.000Z"}),
        headers={"Content-Type": "text/plain;charset=UTF-8", "Origin": PAGE},
    )
    assert response.status_code == 200, response.text
    found = stored(collector)
    assert all(len(found[e["messageId"]]) == 1 for e in events)
    assert client.post("/beacon/v1/batch?writeKey=nope", json={"batch": events}).status_code == 401
    assert client.post("/beacon/v1/batch", json={"batch": events}).status_code == 401


def test_segment_settings_point_analytics_js_at_the_collector(
    collector: Collector, client: httpx.Client
) -> None:
    response = client.get(f"/v1/projects/{KEYS['web']}/settings", headers={"Origin": PAGE})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == PAGE
    segment = response.json()["integrations"]["Segment.io"]
    assert segment["apiHost"] == f"127.0.0.1:{collector.port}/v1"
    assert segment["protocol"] == "http" and segment["apiKey"] == KEYS["web"]
    proxied = client.get(
        f"/v1/projects/{KEYS['web']}/settings",
        headers={"X-Forwarded-Proto": "https", "X-Forwarded-Host": "collector.example, inner"},
    ).json()["integrations"]["Segment.io"]
    assert (proxied["apiHost"], proxied["protocol"]) == ("collector.example/v1", "https")
    assert client.get("/v1/projects/nope/settings").status_code == 404
    assert client.get("/v1/projects/a/b/settings").status_code == 404
    metrics = client.get("/metrics").text
    assert '{path="/v1/projects/settings",status="200"}' in metrics
    assert KEYS["web"] not in metrics


def test_rudderstack_source_config(client: httpx.Client) -> None:
    response = client.get(f"/sourceConfig/?p=npm&v=3.0.0&writeKey={KEYS['app']}")
    assert response.status_code == 200
    source = response.json()["source"]
    assert source["id"] == "app" and source["enabled"] is True and source["destinations"] == []
    header = "Basic " + b64encode(f"{KEYS['web']}:".encode()).decode()
    by_header = client.get("/sourceConfig", headers={"Authorization": header})
    assert by_header.json()["source"]["name"] == "web"
    assert client.get("/sourceConfig/").status_code == 401
    assert client.get("/sourceConfig/?writeKey=nope").status_code == 404
    # a source with allowed origins refuses its config to other pages
    assert (
        client.get(f"/sourceConfig/?writeKey={KEYS['app']}", headers={"Origin": PAGE}).status_code
        == 403
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [("ALLOWED_ORIGINS", '{"nope": ["https://a.example"]}'), ("RATE_LIMITS", '{"nope": 5}')],
)
def test_settings_that_name_no_source_stop_the_start(
    tmp_path: Path, setting: str, value: str
) -> None:
    env = {
        **os.environ,
        "EXACTLY_COLLECTOR__SOURCES": "web=k",
        f"EXACTLY_COLLECTOR__{setting}": value,
    }
    done = subprocess.run(
        [sys.executable, "-m", "exactly", "--data-dir", str(tmp_path), "collect", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"collector.{setting.lower()} names nope, which is not a source" in said(done.stderr)
