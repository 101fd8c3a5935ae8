"""The settings documents the browser SDKs fetch when they load, served by the collector.

analytics.js fetches ``{cdnURL}/v1/projects/{writeKey}/settings`` and the RudderStack JS SDK v3
``{configUrl}/sourceConfig/?writeKey=...``; with those URLs pointed at the collector a page needs
no third-party service. Both documents name no destination (the SDKs load no device-mode
integration) and turn the SDKs' own error and metrics reporting off; analytics.js is told to send
its events to the collector that served the document (``apiHost``).
"""

from __future__ import annotations

from typing import Any

SEGMENT_SETTINGS_PREFIX = "/v1/projects/"
SEGMENT_SETTINGS_SUFFIX = "/settings"
RUDDERSTACK_CONFIG_PATHS = frozenset({"/sourceConfig", "/sourceConfig/"})


def segment_write_key(path: str) -> str | None:
    """The write key in ``/v1/projects/<writeKey>/settings``, else None."""
    if path.startswith(SEGMENT_SETTINGS_PREFIX) and path.endswith(SEGMENT_SETTINGS_SUFFIX):
        key = path[len(SEGMENT_SETTINGS_PREFIX) : -len(SEGMENT_SETTINGS_SUFFIX)]
        if key and "/" not in key:
            return key
    return None


def segment_settings(write_key: str, api_host: str, protocol: str) -> dict[str, Any]:
    """analytics.js's CDN settings: events go to ``protocol://api_host/{t,i,p,...}``."""
    segment = {
        "apiKey": write_key,
        "apiHost": api_host,
        "protocol": protocol,
    }
    default_plan = {"__default": {"enabled": True, "integrations": {}}}
    return {
        "integrations": {"Segment.io": segment},
        "plan": {"track": default_plan, "identify": default_plan, "group": default_plan},
        "edgeFunction": {},
        "analyticsNextEnabled": True,
        "middlewareSettings": {},
        "enabledMiddleware": {},
        "metrics": {"sampleRate": 0},
        "legacyVideoPluginsEnabled": False,
        "remotePlugins": [],
    }


def rudderstack_source_config(source: str) -> dict[str, Any]:
    """The RudderStack JS SDK's source configuration: the source, enabled, no destinations."""
    return {
        "isHosted": True,
        "source": {
            "id": source,
            "name": source,
            "enabled": True,
            "workspaceId": "exactly",
            "config": {
                "statsCollection": {"errors": {"enabled": False}, "metrics": {"enabled": False}}
            },
            "destinations": [],
        },
    }
