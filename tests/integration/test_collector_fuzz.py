"""Fuzzing a real collector: thousands of generated requests, never a 5xx, never a crash.

Two generators: schemathesis, from the collector's own OpenAPI document (valid requests and
requests that break the schema), and hypothesis, for what no schema describes (arbitrary bytes,
arbitrary JSON, broken and hostile gzip, odd headers, unknown paths, events nested deeper than the
encoder writes, small batches whose batch-level context expands to many megabytes). After both,
the collector must still be healthy and every event it accepted must be in the log, once.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from tests.integration.collector_server import KEYS, Collector

pytestmark = pytest.mark.slow

SCHEMA_EXAMPLES = 1000  # per generation mode: 2,000 schemathesis cases
RAW_EXAMPLES = 1200
AUTH = "Basic " + base64.b64encode(f"{KEYS['web']}:".encode()).decode()
FUZZ: dict[str, Any] = dict(
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Collector]:
    with Collector(tmp_path_factory.mktemp("fuzz")) as running:
        yield running


def accepted_count(response: Any, status: int) -> int:
    """Events a 200 answer took (a single-event call takes one)."""
    if status != 200:
        return 0
    document = response.json()
    return int(document.get("accepted", 1))


def test_openapi_generated_requests_never_get_a_5xx(collector: Collector) -> None:
    schema = schemathesis.openapi.from_url(f"{collector.url}/openapi.json")
    session = requests.Session()
    statuses: Counter[int] = Counter()
    accepted = 0

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

        @settings(max_examples=SCHEMA_EXAMPLES, **FUZZ)
        @given(case=schema.as_strategy(mode), authorised=st.booleans())
        def check(case: Any, authorised: bool) -> None:
            nonlocal accepted
            headers = {"Authorization": AUTH} if authorised else {}
            response = case.call(base_url=collector.url, session=session, headers=headers)
            statuses[response.status_code] += 1
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)
            if case.method == "POST":
                document = response.json()  # every answer, error or not, is JSON
                assert isinstance(document, dict)
                if response.status_code != 200:
                    assert document["code"] and document["message"]
                if case.path != "/v1/m":  # analytics.js's own metrics: taken, not kept
                    accepted += accepted_count(response, response.status_code)

        check()
    assert sum(statuses.values()) >= 2 * SCHEMA_EXAMPLES * 0.9, statuses
    assert statuses[200] > 100 and statuses[400] > 100 and statuses[401] > 100, statuses
    assert httpx.get(f"{collector.url}/health").json()["status"] == "ok"
    _assert_logged(collector, accepted)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
_FIELD = st.sampled_from(
    ["type", "event", "userId", "anonymousId", "messageId", "timestamp", "sentAt",
     "originalTimestamp", "properties", "context", "traits", "groupId", "previousId", "name",
     "integrations", "writeKey", "receivedAt", "batch"]
)  # fmt: skip
_EVENTISH = st.dictionaries(_FIELD, _JSON | st.sampled_from(["track", "2024-01-01T00:00:00Z"]))
_VALID = {"type": "track", "event": "e", "userId": "u"}


def _nested(levels: int, batch: bool) -> bytes:
    """An event whose properties nest ``levels`` deep (orjson reads 1,024, writes ~250)."""
    event = '{"type":"track","event":"e","userId":"u","properties":{"x":%s}}' % (
        "[" * levels + "]" * levels
    )
    return (f'{{"batch":[{json.dumps(_VALID)},{event}]}}' if batch else event).encode()


def _expanding(events: int, context_bytes: int) -> bytes:
    """A batch whose batch-level context is copied into each of its events when stored."""
    return json.dumps({"batch": [_VALID] * events, "context": {"c": "x" * context_bytes}}).encode()


_BODY = st.one_of(
    st.binary(max_size=300),
    _JSON.map(lambda value: json.dumps(value).encode()),
    _EVENTISH.map(lambda value: json.dumps(value).encode()),
    st.lists(_EVENTISH, max_size=20).map(lambda batch: json.dumps({"batch": batch}).encode()),
    st.builds(_nested, st.integers(200, 1015), st.booleans()),
    st.builds(_expanding, st.integers(1, 3000), st.integers(0, 30_000)),
)
_PATHS = st.sampled_from(
    ["/v1/track", "/v1/identify", "/v1/page", "/v1/screen", "/v1/group", "/v1/alias",
     "/v1/batch", "/v1/import", "/health", "/metrics", "/v1/", "/v1/track/x", "/", "/%ff"]
)  # fmt: skip


def test_arbitrary_bytes_json_and_gzip_never_get_a_5xx(collector: Collector) -> None:
    statuses: Counter[int] = Counter()
    accepted = 0
    with httpx.Client(base_url=collector.url, timeout=30) as client:

        @settings(max_examples=RAW_EXAMPLES, **FUZZ)
        @given(
            path=_PATHS,
            method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
            body=_BODY,
            encoding=st.sampled_from(
                [None, "gzip", "gzip-broken", "identity", "br", "GZIP", "x-gzip, br"]
            ),
            auth=st.sampled_from([AUTH, None, "Basic", "Basic %%%", "Digest x", "Basic Og=="]),
        )
        def check(
            path: str, method: str, body: bytes, encoding: str | None, auth: str | None
        ) -> None:
            nonlocal accepted
            headers = {}
            if auth is not None:
                headers["Authorization"] = auth
            if encoding == "gzip":
                body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
            elif encoding == "gzip-broken":
                body, headers["Content-Encoding"] = gzip.compress(body)[:-3], "gzip"
            elif encoding is not None:
                headers["Content-Encoding"] = encoding
            response = client.request(method, path, content=body, headers=headers)
            statuses[response.status_code] += 1
            assert response.status_code < 500, (path, body[:200], response.text)
            if path.startswith("/v1/") and method == "POST":
                accepted += accepted_count(response, response.status_code)

        check()
    assert sum(statuses.values()) >= RAW_EXAMPLES * 0.9, statuses
    assert httpx.get(f"{collector.url}/health").json()["status"] == "ok"
    _assert_logged(collector, accepted)


def _assert_logged(collector: Collector, accepted: int) -> None:
    """Each event this module's collector accepted is in raw once (the tests share it, so the
    count adds up over the tests run so far): none lost, none appended twice."""
    ACCEPTED.append(accepted)
    logged = len(collector.records())
    assert logged == sum(ACCEPTED), f"{sum(ACCEPTED)} events accepted, {logged} in the log"


ACCEPTED: list[int] = []  # per test of this module, in the order they ran
