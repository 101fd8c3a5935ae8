"""The collector: a Segment-compatible tracking API as a plain ASGI application.

Guarantee (DESIGN.md boundary 1): a 2xx answer means every event it accepted is durable in the
log (the appender answers only after ``append_many`` returned). Any other answer may leave some of
the request's events appended (a failed group append) or none; the client retries and the dedupe
stage removes repeats by ``messageId``. No input, however malformed, is answered 5xx: bad requests
get a 4xx with a JSON body ``{"success": false, "code", "message"}``; 503 means only "the log
is slow or unavailable, retry after ``Retry-After`` seconds".

What one request may cost is bounded: its body (``max_request_bytes``, before and after
inflating), each event as stored (``max_event_bytes``, and the log's record limit, so one event
the log would refuse is rejected alone and never fails the group append it would share with other
requests), and everything it appends, measured as stored, after the batch-level ``context`` is
copied into each event (``max_append_bytes``, else 413 and nothing appended). A body that stalls
longer than ``read_timeout_seconds``, or arrives slower than ``body_timeout_seconds`` in all, gets
408. Long batches yield every :data:`EVENTS_PER_SLICE` events (:func:`_let_others_run`), so a
hostile batch cannot stall the worker's other requests.

One request's life: route, write key (Basic header first), body within the size limit, gzip,
JSON, events normalised (:mod:`exactly.events`), grouped by the partition of their messageId,
queued for the appender, answered when durable.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import orjson

from exactly.collector import cors, openapi, sdk_settings
from exactly.collector.appender import Appender, QueueFull
from exactly.collector.body import (
    ClientGone,
    HTTPError,
    NoRoom,
    Receive,
    TrackedBody,
    decode,
    drain,
    linger,
    read_body,
)
from exactly.collector.front import address_of
from exactly.collector.memory import BodyBudget, Hold, tune_malloc
from exactly.collector.metrics import Metrics
from exactly.collector.ratelimit import RateLimiter
from exactly.collector.settings import EXPANSION_FLOOR, CollectorSettings
from exactly.collector.sources import Sources, Unauthorized, basic_username
from exactly.collector.wire import RECORD
from exactly.errors import ExactlyError, InvalidEvent, LogUnavailable, UnknownTopic
from exactly.events import Receipt, normalise, partition_for
from exactly.forget.regulations import Forgotten
from exactly.gcra import Rate
from exactly.log import Log, open_log
from exactly.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

Scope = dict[str, Any]
Send = Callable[[dict[str, Any]], Awaitable[None]]

logger = logging.getLogger("exactly.collector")

SINGLE_EVENT_PATHS = {f"/v1/{kind}": kind for kind in openapi.SINGLE_EVENT_TYPES} | {
    f"/v1/{kind[0]}": kind for kind in openapi.SINGLE_EVENT_TYPES
}  # analytics.js posts to /v1/t, /v1/i, /v1/p, /v1/s, /v1/g, /v1/a
BATCH_PATHS = frozenset({"/v1/batch", "/v1/import", "/v1/b"})
BEACON_PATH = "/beacon/v1/batch"  # RudderStack's sendBeacon: the write key in the query string
DISCARD_PATHS = frozenset({"/v1/m"})  # analytics.js's own metrics: taken, not kept
GET_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})
POST_PATHS = SINGLE_EVENT_PATHS.keys() | BATCH_PATHS | DISCARD_PATHS | {BEACON_PATH}
SEGMENT_SETTINGS_LABEL = "/v1/projects/settings"  # the metrics label: never the write key
MAX_LISTED_REJECTIONS = 1000
EVENTS_PER_SLICE = 1000  # events normalised between two yields to the event loop

_JSON = b"application/json"
_OK = b'{"success":true}'
_CLOSE = (b"connection", b"close")


def _rejection(index: int, event: object, error: InvalidEvent) -> dict[str, Any]:
    message_id = event.get("messageId") if type(event) is dict else None
    return {
        "index": index,
        "messageId": message_id if type(message_id) is str else None,
        "code": error.code,
        "message": error.message,
    }


class CollectorApp:
    """The ASGI application of one worker process; its appender starts at lifespan startup."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.sources = Sources(settings.sources)
        self.origins = cors.Origins((s.name for s in settings.sources), settings.allowed_origins)
        self.rate_limiter = RateLimiter(
            {
                name: Rate(limit.per_second, limit.burst)
                for name, limit in settings.rate_limits.items()
            }
        )
        self.byte_limiter = RateLimiter(
            {
                name: Rate(limit.per_second, limit.burst)
                for name, limit in settings.byte_limits.items()
            }
        )
        self.metrics = Metrics()
        self.body_budget = BodyBudget(settings.max_buffered_bytes)
        self.partitions = settings.partitions
        self.appender: Appender | None = None
        self.last_error: str | None = None
        self._openapi = orjson.dumps(openapi.document())
        self.forgotten: Forgotten | None = None  # what exactly forget suppresses, kept fresh
        self._regulations: asyncio.Task[None] | None = None

    # -- life cycle -----------------------------------------------------------------------------

    async def startup(self) -> None:
        """Make sure the topic exists (learning its partition count), start the appender."""
        settings = self.settings
        self.partitions = await asyncio.get_running_loop().run_in_executor(None, self._topic)
        self.appender = Appender(
            settings.log_url,
            settings.topic,
            max_record_bytes=settings.max_record_bytes,
            max_pending_bytes=settings.max_pending_bytes,
            metrics=self.metrics,
        )
        await self.appender.start()
        if settings.forget_key_file is not None:
            # the regulations are read once before the first request is taken: a forgotten
            # person's events sent the moment the collector starts are not stored either
            read: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._regulations = asyncio.create_task(self._follow_regulations(read))
            await asyncio.wait([read, self._regulations], return_when=asyncio.FIRST_COMPLETED)

    async def _follow_regulations(self, read: asyncio.Future[None]) -> None:
        """Keep :attr:`forgotten` at most a second behind the regulations topic; ``read`` is
        done once the first reading is (or failed: the log is away, :attr:`last_error`)."""
        from exactly.forget.regulations import REFRESH_SECONDS, Regulations, read_key

        assert self.settings.forget_key_file is not None
        loop = asyncio.get_running_loop()
        key = await loop.run_in_executor(None, read_key, Path(self.settings.forget_key_file))
        log = await loop.run_in_executor(None, self._open_log)
        regulations = Regulations(log)
        try:
            while True:
                try:
                    await loop.run_in_executor(None, regulations.refresh)
                    self.forgotten = regulations.forgotten(key)
                except ExactlyError as error:  # the log is away: keep what was read
                    self.last_error = str(error)
                if not read.done():
                    read.set_result(None)
                await asyncio.sleep(REFRESH_SECONDS / 2)
        finally:
            log.close()

    def _open_log(self) -> Log:
        return open_log(self.settings.log_url, max_record_bytes=self.settings.max_record_bytes)

    def _topic(self) -> int:
        settings = self.settings
        with open_log(settings.log_url, max_record_bytes=settings.max_record_bytes) as log:
            try:
                return log.topic_info(settings.topic).partitions
            except UnknownTopic:
                return log.create_topic(
                    settings.topic, settings.partitions, exist_ok=True
                ).partitions

    async def shutdown(self) -> None:
        """Append and answer what is queued, then stop the appender."""
        if self._regulations is not None:
            self._regulations.cancel()
        if self.appender is not None:
            await self.appender.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as error:  # noqa: BLE001 - the server must hear why, in one line
                    await send({"type": "lifespan.startup.failed", "message": str(error)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- HTTP -----------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        path: str = scope["path"]
        content_type = _JSON
        headers: tuple[tuple[bytes, bytes], ...] = ()
        origin = _header(scope, b"origin")
        request = TrackedBody(receive)
        lingers = True  # after an answer that closes with the body unread (see linger)
        try:
            status, body, content_type, headers = await self._route(scope, request, path, origin)
            if not request.started and _has_body(scope) and not await drain(request):
                headers = (*headers, _CLOSE)  # a GET that sent a body
        except HTTPError as error:
            status, body, headers = error.status, error.body(), error.headers
            if not request.started and (not error.drain or not await drain(request)):
                headers = (*headers, _CLOSE)
            lingers = error.drain  # not a 503 busy: reading costs what its budget bounds
        except ClientGone:
            # the client went away, or its chunked body was malformed (the server cannot tell
            # us which): answer anyway, nobody hears it in the first case
            failure = HTTPError(400, "invalid_body", "the request body could not be read")
            status, body = failure.status, failure.body()
        except Exception:
            logger.exception("collector: unexpected error on %s", path)
            failure = HTTPError(500, "internal", "the collector failed; the request was not taken")
            status, body = failure.status, failure.body()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    *headers,
                    *cors.response_headers(origin, self.origins.any_allows(origin)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        self.metrics.request(_label(path), status, time.perf_counter() - started)
        if lingers and _CLOSE in headers:
            await linger(receive)  # the body was left unread: let the answer reach the client

    async def _route(
        self, scope: Scope, receive: Receive, path: str, origin: bytes | None
    ) -> tuple[int, bytes, bytes, tuple[tuple[bytes, bytes], ...]]:
        """Status, body, content type and extra headers of the answer to one request."""
        method = scope["method"]
        segment_key = sdk_settings.segment_write_key(path)
        if path in POST_PATHS:
            allowed = b"POST"
        elif path in GET_PATHS or segment_key or path in sdk_settings.RUDDERSTACK_CONFIG_PATHS:
            allowed = b"GET"
        else:
            raise HTTPError(404, "not_found", f"there is no {path[:100]!r}; see /openapi.json")
        if method == "OPTIONS":  # a preflight: before the method check and before any key
            return self._preflight(scope, origin, allowed)
        if method != allowed.decode():
            raise HTTPError(
                405,
                "method_not_allowed",
                f"{path} takes {allowed.decode()}",
                headers=((b"allow", allowed + b", OPTIONS"),),
            )
        if path in GET_PATHS:
            return (*self._get(path), ())
        if segment_key is not None or path in sdk_settings.RUDDERSTACK_CONFIG_PATHS:
            return self._sdk_settings(scope, origin, segment_key)
        if path in DISCARD_PATHS:
            hold = self.body_budget.hold(keyed=False)
            try:
                await self._read_body(scope, receive, hold)
            finally:
                hold.release()
            return 200, _OK, _JSON, ()
        return (*await self._post(scope, receive, SINGLE_EVENT_PATHS.get(path), origin), ())

    def _preflight(
        self, scope: Scope, origin: bytes | None, allowed: bytes
    ) -> tuple[int, bytes, bytes, tuple[tuple[bytes, bytes], ...]]:
        if not self.origins.any_allows(origin):
            raise self._origin_refused()
        headers = cors.preflight_headers(
            allowed + b", OPTIONS",
            _header(scope, b"access-control-request-headers"),
            _header(scope, b"access-control-request-private-network") == b"true",
        )
        return 204, b"", _JSON, headers

    def _origin_refused(self) -> HTTPError:
        self.metrics.reject("origin_not_allowed")
        return HTTPError(
            403,
            "origin_not_allowed",
            "this source does not take events from pages on this origin; "
            "see [collector.allowed_origins]",
        )

    def _sdk_settings(
        self, scope: Scope, origin: bytes | None, segment_key: str | None
    ) -> tuple[int, bytes, bytes, tuple[tuple[bytes, bytes], ...]]:
        """analytics.js's CDN settings or RudderStack's source config, for a known write key."""
        key = segment_key
        if key is None:
            found = _query_value(scope, b"writeKey")
            authorization = _header(scope, b"authorization")
            if found is None and authorization is not None:
                try:
                    found = basic_username(authorization)
                except Unauthorized as error:
                    raise self._unauthorized(str(error)) from None
            key = None if found is None else found.decode("utf-8", "replace")
        if not key:
            raise self._unauthorized("no write key: pass writeKey in the query string")
        try:
            source = self.sources.source_of(key.encode())
        except Unauthorized:
            raise HTTPError(404, "unknown_write_key", "no source has this write key") from None
        self._admit(scope, source, origin)
        if segment_key is None:
            document = sdk_settings.rudderstack_source_config(source)
        else:
            # behind a TLS proxy the page reached https://PUBLIC_HOST: the proxy says so
            forwarded_host = _header(scope, b"x-forwarded-host")
            host_header = forwarded_host.split(b",")[0].strip() if forwarded_host else None
            host = (host_header or _header(scope, b"host") or b"localhost")[:300].decode("latin-1")
            proto = (_header(scope, b"x-forwarded-proto") or b"").split(b",")[0].strip()
            scheme = "https" if b"https" in (proto, scope.get("scheme", "").encode()) else "http"
            document = sdk_settings.segment_settings(key, f"{host}/v1", scheme)
        return 200, orjson.dumps(document), _JSON, ((b"cache-control", b"no-store"),)

    def _client(self, scope: Scope) -> str | None:
        """The client's address, as the limits see it: behind the connection front (issue 33)
        it is in the name of the front's socket (:func:`exactly.collector.front.address_of`)."""
        client = scope.get("client")
        if not client:
            return None
        front = self.settings.front_directory
        return address_of(client[0], front) if front else client[0]

    def _admit(self, scope: Scope, source: str, origin: bytes | None) -> None:
        """403 when ``source`` does not take events from pages on ``origin``; 429 when the
        client sent more than the source's rate limit."""
        if not self.origins.allows(source, origin):
            raise self._origin_refused()
        wait = self.rate_limiter.check(source, self._client(scope), time.monotonic())
        if wait:
            self.metrics.reject("rate_limited")
            raise HTTPError(
                429,
                "rate_limited",
                f"this client sent more requests to this source than its limit allows; "
                f"retry in {wait} s",
                headers=((b"retry-after", str(wait).encode()),),
            )

    def _get(self, path: str) -> tuple[int, bytes, bytes]:
        if path == "/metrics":
            return 200, self.metrics.render(), METRICS_CONTENT_TYPE
        if path == "/openapi.json":
            return 200, self._openapi, _JSON
        healthy = self.appender is not None and self.appender.running and self.last_error is None
        document = {
            "status": "ok" if healthy else "failing",
            "queuedBytes": self.appender.pending_bytes if self.appender else 0,
        }
        if self.last_error:
            document["error"] = self.last_error
        return (200 if healthy else 503), orjson.dumps(document), _JSON

    async def _post(
        self, scope: Scope, receive: Receive, kind: str | None, origin: bytes | None
    ) -> tuple[int, bytes, bytes]:
        authorization = encoding = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-encoding":
                encoding = value
        try:
            if authorization is not None:
                source: str | None = self.sources.source_of(basic_username(authorization))
            elif scope["path"] == BEACON_PATH:
                source = self.sources.source_of(_query_value(scope, b"writeKey") or b"")
            else:
                source = None
        except Unauthorized as error:
            raise self._unauthorized(str(error)) from None
        if source is not None:
            self._admit(scope, source, origin)
        hold = self.body_budget.hold(keyed=source is not None)
        try:
            return await self._take(scope, receive, hold, source, encoding, kind, origin)
        finally:
            hold.release()

    async def _take(
        self,
        scope: Scope,
        receive: Receive,
        hold: Hold,
        source: str | None,
        encoding: bytes | None,
        kind: str | None,
        origin: bytes | None,
    ) -> tuple[int, bytes, bytes]:
        """The rest of :meth:`_post`, its body held in ``hold`` until it returns."""
        limit = self.settings.max_request_bytes
        body = await self._read_body(scope, receive, hold)
        sent = len(body)
        raw = decode(body, encoding, limit)
        del body
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            self.metrics.reject("invalid_json")
            raise HTTPError(400, "invalid_json", f"the body is not valid JSON: {error}") from None
        if type(document) is not dict:
            self.metrics.reject("invalid_json")
            raise HTTPError(400, "invalid_json", "the body must be a JSON object")
        if source is None:
            source = self._source_from_body(document.get("writeKey"))
            self._admit(scope, source, origin)
        most = self._most(sent)
        if kind is not None:
            return await self._single(scope, document, kind, source, most)
        return await self._batch(scope, document, source, most)

    def _most(self, sent: int) -> tuple[int, str]:
        """What a request that sent ``sent`` bytes may store, and the setting that says so."""
        settings = self.settings
        expanded = max(EXPANSION_FLOOR, int(settings.max_expansion * sent))
        if expanded < settings.max_append_bytes:
            return expanded, (
                f"{expanded} bytes as stored: {settings.max_expansion:g} times the {sent} bytes "
                "it sent (collector.max_expansion)"
            )
        return settings.max_append_bytes, (
            f"{settings.max_append_bytes} bytes as stored (collector.max_append_mb)"
        )

    def _limit_bytes(self, scope: Scope, source: str, size: int, events: int) -> None:
        """429 when the client stored more bytes in ``source`` than its byte limit allows."""
        wait = self.byte_limiter.check(source, self._client(scope), time.monotonic(), size)
        if wait:
            self.metrics.reject("byte_limited", events)
            raise HTTPError(
                429,
                "byte_limited",
                f"this client stored more bytes in this source than its limit allows "
                f"(collector.byte_limits); retry in {wait} s",
                headers=((b"retry-after", str(wait).encode()),),
            )

    async def _read_body(self, scope: Scope, receive: Receive, hold: Hold) -> bytearray:
        settings = self.settings
        try:
            return await read_body(
                receive,
                settings.max_request_bytes,
                _length(scope),
                settings.read_timeout_seconds,
                settings.body_timeout_seconds,
                hold,
            )
        except NoRoom:
            self.metrics.reject("busy")
            raise HTTPError(
                503,
                "busy",
                f"the collector is buffering {settings.max_buffered_bytes} bytes of request "
                "bodies still arriving, its limit (collector.max_buffered_mb); retry after "
                "Retry-After seconds",
                headers=(
                    (b"retry-after", str(settings.retry_after_seconds).encode()),
                    _CLOSE,
                ),
                drain=False,
            ) from None

    def _source_from_body(self, write_key: object) -> str:
        if type(write_key) is not str or not write_key:
            raise self._unauthorized(
                "no write key: send it as the Basic username or as writeKey in the body"
            )
        try:
            return self.sources.source_of(write_key.encode())
        except Unauthorized as error:
            raise self._unauthorized(str(error)) from None

    def _unauthorized(self, message: str) -> HTTPError:
        self.metrics.reject("unauthorized")
        return HTTPError(
            401, "unauthorized", message, headers=((b"www-authenticate", b'Basic realm="exactly"'),)
        )

    def _receipt(self, source: str, envelope: dict[str, Any] | None = None) -> Receipt:
        settings = self.settings
        return Receipt.of(
            source,
            envelope,
            max_event_bytes=settings.max_event_bytes,
            max_record_bytes=settings.max_record_bytes,
        )

    async def _single(
        self,
        scope: Scope,
        event: dict[str, Any],
        kind: str,
        source: str,
        most: tuple[int, str],
    ) -> tuple[int, bytes, bytes]:
        try:
            normalised = normalise(event, self._receipt(source), kind)
        except InvalidEvent as error:
            self.metrics.reject(error.code)
            status = 413 if error.code == "too_large" else 400
            raise HTTPError(status, error.code, error.message) from None
        if self.forgotten and self.forgotten.event(event):
            self.metrics.suppress(source, 1)  # a forgotten person's: answered, never stored
            return 200, _OK, _JSON
        key, value = normalised.message_id.encode(), normalised.value
        partition = partition_for(key, self.partitions)
        record = _pack(partition, len(key), len(value)) + key + value
        if len(record) > most[0]:
            self.metrics.reject("too_large")
            raise HTTPError(413, "too_large", f"this event is more than {most[1]}")
        self._limit_bytes(scope, source, len(record), 1)
        await self._append(record, 1, len(record))
        self.metrics.accept(source, 1)
        return 200, _OK, _JSON

    async def _batch(
        self, scope: Scope, document: dict[str, Any], source: str, limit: tuple[int, str]
    ) -> tuple[int, bytes, bytes]:
        events = document.get("batch")
        if type(events) is not list or not events:
            self.metrics.reject("invalid_batch")
            raise HTTPError(400, "invalid_batch", "batch must be a non-empty list of events")
        try:
            receipt = self._receipt(source, document)
        except InvalidEvent as error:
            self.metrics.reject(error.code, len(events))
            raise HTTPError(400, error.code, error.message) from None
        parts: list[bytes] = []
        rejected: list[dict[str, Any]] = []
        codes: Counter[str] = Counter()
        size = 0
        most, named = limit
        partitions = self.partitions
        forgotten = self.forgotten if self.forgotten else None
        suppressed = 0
        for index, event in enumerate(events):
            if index and not index % EVENTS_PER_SLICE:
                await _let_others_run()
            try:
                message_id, value = normalise(event, receipt)
            except InvalidEvent as error:
                codes[error.code] += 1
                if len(rejected) < MAX_LISTED_REJECTIONS:
                    rejected.append(_rejection(index, event, error))
                continue
            if forgotten is not None and forgotten.event(event):
                suppressed += 1  # a forgotten person's: answered, never stored
                continue
            key = message_id.encode()
            size += RECORD.size + len(key) + len(value)
            if size > most:
                self.metrics.reject("too_large", len(events))
                raise HTTPError(
                    413,
                    "too_large",
                    f"the events of this request are more than {named}, after the batch's "
                    "context and integrations are merged into each event; send smaller batches",
                )
            parts += (_pack(partition_for(key, partitions), len(key), len(value)), key, value)
        for code, count in codes.items():
            self.metrics.reject(code, count)
        if suppressed:
            self.metrics.suppress(source, suppressed)
        accepted = len(events) - codes.total() - suppressed
        listed: dict[str, Any] = {"rejected": rejected} if rejected else {}
        if codes.total() > len(rejected):
            listed["rejectedNotListed"] = codes.total() - len(rejected)
        if not accepted and suppressed:
            return 200, orjson.dumps({"success": True, "accepted": 0, **listed}), _JSON
        if not accepted:
            raise HTTPError(
                400, "no_valid_events", "every event of the batch was rejected", extra=listed
            )
        self._limit_bytes(scope, source, size, accepted)
        await self._append(b"".join(parts), accepted, size)
        self.metrics.accept(source, accepted)
        return 200, orjson.dumps({"success": True, "accepted": accepted, **listed}), _JSON

    async def _append(self, records: bytes, events: int, size: int) -> None:
        """Wait until the events are durable; 503 when the queue is full or the log failed."""
        assert self.appender is not None
        retry = ((b"retry-after", str(self.settings.retry_after_seconds).encode()),)
        try:
            await self.appender.submit(records, size)
        except QueueFull as error:
            self.metrics.reject("queue_full", events)
            raise HTTPError(503, "queue_full", str(error), headers=retry) from None
        except LogUnavailable as error:
            self.last_error = str(error)
            self.metrics.reject("log_unavailable", events)
            raise HTTPError(503, "log_unavailable", str(error), headers=retry) from None
        self.last_error = None


_pack = RECORD.pack


async def _let_others_run() -> None:
    """Give the worker's other requests a turn in the middle of a long computation.

    Yielding to the event loop is not enough: granian's I/O thread must take the GIL to hand a
    new request to the loop, and a coroutine that only awaits ``sleep(0)`` keeps the GIL through
    the loop's turns. A batch of 150,000 integers then held a ``/health`` probe for its whole
    0.15 s after the first few milliseconds; releasing the GIL at each slice answers the probe
    within 2-3 ms and costs the batch about a tenth of its time
    (``tests/integration/test_collector_hostile.py``).
    """
    time.sleep(0)  # releases the GIL: a thread waiting for it runs
    await asyncio.sleep(0)


def _has_body(scope: Scope) -> bool:
    """Whether the request declares a body (drained before an answer that did not read it:
    granian closed such a connection after the answer, behind the front without saying so)."""
    length = _header(scope, b"content-length")
    return (length is not None and length.strip() not in (b"", b"0")) or (
        _header(scope, b"transfer-encoding") is not None
    )


def _header(scope: Scope, wanted: bytes) -> bytes | None:
    for name, value in scope["headers"]:
        if name == wanted:
            return value  # type: ignore[no-any-return]
    return None


def _length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    return int(value) if value is not None and value.isdigit() else None


def _query_value(scope: Scope, name: bytes) -> bytes | None:
    """The first value of ``name`` in the query string, unquoted; None when absent."""
    for pair in scope.get("query_string", b"").split(b"&"):
        key, _, value = pair.partition(b"=")
        if key == name:
            return unquote_to_bytes(value.replace(b"+", b" "))
    return None


def _label(path: str) -> str:
    """The path as a metrics label: a known path, or a name for a family of them."""
    if path in POST_PATHS or path in GET_PATHS:
        return path
    if sdk_settings.segment_write_key(path) is not None:
        return SEGMENT_SETTINGS_LABEL
    if path in sdk_settings.RUDDERSTACK_CONFIG_PATHS:
        return "/sourceConfig"
    return "other"


def from_environment() -> CollectorApp:
    """The factory the ASGI server calls in each worker: settings from the environment.

    A worker dies with the server process that started it, so a collector SIGKILLed does not
    leave workers holding its port (its appenders still finish what they were sent).
    """
    from exactly.lifetime import die_with_parent

    die_with_parent()
    tune_malloc()
    return CollectorApp(CollectorSettings.from_environment())
