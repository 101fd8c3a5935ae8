"""The OpenAPI 3.0 document of the collector, served at ``GET /openapi.json``.

Written by hand, beside the rules in :mod:`exactly.events.normalise` it describes; the fuzz tests
generate requests from it, so a rule added there without a word here goes untested by them.
"""

from __future__ import annotations

from typing import Any

from exactly.events import MAX_MESSAGE_ID_LENGTH

SINGLE_EVENT_TYPES = ("track", "identify", "page", "screen", "group", "alias")

_ID = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
_COMMON: dict[str, Any] = {
    "messageId": {
        "type": "string",
        "maxLength": MAX_MESSAGE_ID_LENGTH,
        "description": "the event's id; deduplication is by messageId (a KSUID when absent)",
    },
    "userId": _ID,
    "anonymousId": _ID,
    "timestamp": {"type": "string", "format": "date-time"},
    "originalTimestamp": {"type": "string", "format": "date-time"},
    "sentAt": {"type": "string", "format": "date-time"},
    "context": {"type": "object"},
    "integrations": {"type": "object"},
}
_USER = {"anyOf": [{"required": ["userId"]}, {"required": ["anonymousId"]}]}
_SPECIFIC: dict[str, tuple[dict[str, Any], list[str], bool]] = {
    "track": ({"event": {"type": "string", "minLength": 1}, "properties": {"type": "object"}},
              ["event"], True),
    "identify": ({"traits": {"type": "object"}}, [], True),
    "page": ({"name": {"type": "string"}, "category": {"type": "string"},
              "properties": {"type": "object"}}, [], True),
    "screen": ({"name": {"type": "string"}, "category": {"type": "string"},
                "properties": {"type": "object"}}, [], True),
    "group": ({"groupId": _ID, "traits": {"type": "object"}}, ["groupId"], True),
    "alias": ({"previousId": _ID}, ["userId", "previousId"], False),
}  # fmt: skip


def _event_schema(kind: str, *, typed: bool) -> dict[str, Any]:
    fields, required, needs_user = _SPECIFIC[kind]
    properties = {**_COMMON, **fields}
    if typed:
        properties["type"] = {"type": "string", "enum": [kind]}
        required = ["type", *required]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if needs_user:
        schema.update(_USER)
    return schema


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


_ERROR = {
    "type": "object",
    "required": ["success", "code", "message"],
    "properties": {
        "success": {"type": "boolean", "enum": [False]},
        "code": {"type": "string"},
        "message": {"type": "string"},
        "rejected": {"type": "array", "items": {"$ref": "#/components/schemas/Rejection"}},
    },
}
_ERRORS = {
    "400": _error("invalid JSON, or an invalid event (batch: no valid event)"),
    "401": _error("no write key, or one no source has"),
    "403": _error("the source does not take events from the page's origin"),
    "413": _error("body over 500 KB, or (single event) an event over 32 KB"),
    "415": _error("a Content-Encoding other than gzip, deflate or identity"),
    "503": _error("the queue to the log is full or the log failed: retry after Retry-After"),
}


_PREFLIGHT = {
    "summary": "CORS preflight: answered before any write key is asked for",
    "security": [],
    "responses": {
        "204": {"description": "the method and requested headers are allowed"},
        "403": {"description": "no source takes events from this origin"},
    },
}


def _single(kind: str, operation_id: str) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation_id,
            "summary": f"record one {kind} event",
            "requestBody": {
                "required": True,
                "content": {
                    media: {"schema": _event_schema(kind, typed=False)} for media in _MEDIA
                },
            },
            "responses": {
                "200": {
                    "description": "the event is durable in the log",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **_ERRORS,
            },
        },
        "options": {"operationId": f"{operation_id}_preflight", **_PREFLIGHT},
    }


# analytics.js sends text/plain (a "simple" content type); both are read as JSON
_MEDIA = ("application/json", "text/plain")


def document() -> dict[str, Any]:
    """The OpenAPI document."""
    paths: dict[str, Any] = {}
    for kind in SINGLE_EVENT_TYPES:
        paths[f"/v1/{kind}"] = _single(kind, kind)
        paths[f"/v1/{kind[0]}"] = _single(kind, f"{kind}_short")
    batch = {
        "summary": "record up to 500 KB of events; valid ones are taken, invalid ones named",
        "requestBody": {
            "required": True,
            "content": {
                media: {"schema": {"$ref": "#/components/schemas/Batch"}} for media in _MEDIA
            },
        },
        "responses": {
            "200": {
                "description": "the accepted events are durable; rejected ones are listed",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/BatchResult"}}
                },
            },
            **_ERRORS,
        },
    }
    for path, name in (("/v1/batch", "batch"), ("/v1/import", "import"), ("/v1/b", "b")):
        paths[path] = {
            "post": {"operationId": name, **batch},
            "options": {"operationId": f"{name}_preflight", **_PREFLIGHT},
        }
    paths["/beacon/v1/batch"] = {
        "post": {
            "operationId": "beacon",
            **batch,
            "summary": "a batch sent with navigator.sendBeacon (RudderStack): the write key is "
            "in the query string",
            "security": [],
            "parameters": [
                {"name": "writeKey", "in": "query", "required": True, "schema": {"type": "string"}}
            ],
        },
        "options": {"operationId": "beacon_preflight", **_PREFLIGHT},
    }
    paths["/v1/m"] = {
        "post": {
            "operationId": "sdk_metrics",
            "summary": "analytics.js's own metrics: taken and discarded",
            "security": [],
            "requestBody": {"content": {"text/plain": {"schema": {"type": "object"}}}},
            "responses": {"200": {"description": "discarded"}, "413": _ERRORS["413"]},
        },
        "options": {"operationId": "sdk_metrics_preflight", **_PREFLIGHT},
    }
    paths["/v1/projects/{writeKey}/settings"] = {
        "get": {
            "operationId": "segment_settings",
            "summary": "analytics.js's CDN settings (point cdnURL at the collector)",
            "security": [],
            "parameters": [
                {"name": "writeKey", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {"description": "the settings; events go to this collector"},
                "404": {"description": "no source has this write key"},
            },
        }
    }
    paths["/sourceConfig/"] = {
        "get": {
            "operationId": "rudderstack_source_config",
            "summary": "the RudderStack JS SDK's source config (point configUrl at the collector)",
            "parameters": [
                {"name": "writeKey", "in": "query", "required": False, "schema": {"type": "string"}}
            ],
            "responses": {
                "200": {"description": "the source, enabled, without destinations"},
                "401": {"description": "no write key"},
                "404": {"description": "no source has this write key"},
            },
        }
    }
    paths["/health"] = {
        "get": {
            "operationId": "health",
            "summary": "whether the last append to the log succeeded",
            "responses": {"200": {"description": "healthy"}, "503": {"description": "failing"}},
        }
    }
    paths["/metrics"] = {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics",
            "responses": {"200": {"description": "text exposition format"}},
        }
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "exactly collector",
            "version": "1",
            "description": (
                "A Segment-compatible tracking API. The write key is the HTTP Basic username "
                "(password empty) or writeKey in the body. Bodies may be gzip-compressed. A 200 "
                "means the accepted events are durable."
            ),
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"writeKey": {"type": "http", "scheme": "basic"}},
            "schemas": {
                "Batch": {
                    "type": "object",
                    "required": ["batch"],
                    "properties": {
                        "batch": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "oneOf": [
                                    _event_schema(kind, typed=True) for kind in SINGLE_EVENT_TYPES
                                ]
                            },
                        },
                        "sentAt": _COMMON["sentAt"],
                        "context": {"type": "object"},
                        "integrations": {"type": "object"},
                        "writeKey": {"type": "string"},
                    },
                },
                "BatchResult": {
                    "type": "object",
                    "required": ["success", "accepted"],
                    "properties": {
                        "success": {"type": "boolean"},
                        "accepted": {"type": "integer"},
                        "rejected": {
                            "type": "array",
                            "items": {"$ref": "#/components/schemas/Rejection"},
                        },
                    },
                },
                "Rejection": {
                    "type": "object",
                    "required": ["index", "code", "message"],
                    "properties": {
                        "index": {"type": "integer"},
                        "messageId": {"type": "string", "nullable": True},
                        "code": {"type": "string"},
                        "message": {"type": "string"},
                    },
                },
            },
        },
        "security": [{"writeKey": []}],
    }
