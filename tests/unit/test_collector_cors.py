"""CORS policy of the collector (pure): origins per source, answer and preflight headers."""

from __future__ import annotations

import pytest

from exactly.collector.cors import Origins, normalise_origin, preflight_headers, response_headers
from exactly.config import load_settings
from exactly.errors import ConfigError


def test_origins_are_normalised_and_checked() -> None:
    assert normalise_origin(" HTTPS://Shop.Example/ ") == "https://shop.example"
    assert normalise_origin("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert normalise_origin("*") == "*" and normalise_origin("null") == "null"
    for bad in ("shop.example", "https://shop.example/path", "ftp://x", ""):
        with pytest.raises(ValueError, match="not an origin"):
            normalise_origin(bad)


def test_a_source_without_a_list_takes_any_origin() -> None:
    origins = Origins(["web", "app"], {"app": ["https://shop.example"]})
    assert origins.allows("web", b"http://anything.example")
    assert origins.allows("app", b"https://SHOP.example")
    assert not origins.allows("app", b"https://evil.example")
    assert origins.allows("app", None)  # not a page
    assert origins.any_allows(b"https://evil.example")  # web takes it: preflight answered


def test_a_preflight_is_refused_when_no_source_takes_the_origin() -> None:
    origins = Origins(["web"], {"web": ["https://shop.example"]})
    assert not origins.any_allows(b"https://evil.example")
    assert origins.any_allows(b"https://shop.example") and origins.any_allows(None)
    assert Origins(["web"], {"web": ["*"]}).any_allows(b"https://evil.example")


def test_answer_headers() -> None:
    assert dict(response_headers(None, True))[b"access-control-allow-origin"] == b"*"
    echoed = dict(response_headers(b"https://a.example", True))
    assert echoed[b"access-control-allow-origin"] == b"https://a.example"
    assert echoed[b"access-control-allow-credentials"] == b"true"
    assert echoed[b"access-control-expose-headers"] == b"retry-after"
    assert echoed[b"vary"] == b"origin"
    assert b"access-control-allow-origin" not in dict(response_headers(b"https://a.example", False))


def test_preflight_echoes_plain_header_lists_only() -> None:
    found = dict(preflight_headers(b"POST, OPTIONS", b"Authorization, Content-Type", False))
    assert found[b"access-control-allow-headers"] == b"authorization, content-type"
    assert found[b"access-control-allow-methods"] == b"POST, OPTIONS"
    for odd in (b"a\r\nb", b"x;y", b"a" * 2000, None):
        headers = dict(preflight_headers(b"POST", odd, True))
        assert b"authorization" in headers[b"access-control-allow-headers"]
        assert headers[b"access-control-allow-private-network"] == b"true"


def test_allowed_origins_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXACTLY_COLLECTOR__ALLOWED_ORIGINS", '{"web": ["https://Shop.example/"]}')
    settings = load_settings()
    assert settings.collector.allowed_origins == {"web": ("https://shop.example",)}
    monkeypatch.setenv("EXACTLY_COLLECTOR__ALLOWED_ORIGINS", '{"web": ["shop.example"]}')
    with pytest.raises(ConfigError, match="allowed_origins"):
        load_settings()


def test_the_openapi_document_names_every_route_and_its_preflight() -> None:
    """The fuzz tests generate requests from the document: a route missing there goes unfuzzed."""
    from exactly.collector import openapi
    from exactly.collector.app import GET_PATHS, POST_PATHS

    paths = openapi.document()["paths"]
    for path in POST_PATHS:
        assert "post" in paths[path] and "options" in paths[path], path
    assert set(GET_PATHS) - {"/openapi.json"} <= set(paths)
    assert {"/v1/projects/{writeKey}/settings", "/sourceConfig/"} <= set(paths)
