"""The collector's rate-limit table (GCRA itself: tests/unit/test_gcra.py): keys, the bound."""

from __future__ import annotations

import pytest

from exactly.collector.ratelimit import RateLimiter, client_key
from exactly.config import load_settings
from exactly.errors import ConfigError
from exactly.gcra import Rate


def test_the_limiter_keys_sources_and_addresses_and_rounds_retry_after_up() -> None:
    limiter = RateLimiter({"web": Rate(2.0, 2)})
    assert limiter.check("web", "10.0.0.1", 0.0) == 0
    assert limiter.check("web", "10.0.0.1", 0.0) == 0
    assert limiter.check("web", "10.0.0.1", 0.0) == 1  # 0.5 s, as whole seconds
    assert limiter.check("web", "10.0.0.2", 0.0) == 0  # another client
    assert limiter.check("app", "10.0.0.1", 0.0) == 0  # a source without a limit
    assert limiter.check("web", None, 0.0) == 0  # no address known (a Unix socket)
    assert limiter.check("web", "10.0.0.1", 0.5) == 0


def test_ipv6_clients_are_limited_per_64() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::2")
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"
    assert client_key("10.0.0.1") == "10.0.0.1"
    assert client_key("not:an:address") == "not:an:address"


def test_the_table_is_bounded_and_forgets_idle_clients_first() -> None:
    limiter = RateLimiter({"web": Rate(1.0, 1)}, max_clients=100)
    for n in range(100):
        limiter.check("web", f"10.0.0.{n}", 0.0)
    assert len(limiter) == 100
    limiter.check("web", "10.0.1.0", 10.0)  # every other bucket is empty again by now
    assert len(limiter) == 1
    for n in range(100):
        limiter.check("web", f"10.0.2.{n}", 10.0)  # all busy: the oldest go
    assert len(limiter) <= 100
    assert limiter.check("web", "10.0.2.99", 10.0) == 1  # the newest is remembered


def test_rate_limit_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXACTLY_COLLECTOR__RATE_LIMIT", "50")
    monkeypatch.setenv("EXACTLY_COLLECTOR__RATE_LIMITS", '{"server": 0, "web": 5}')
    config = load_settings().collector
    assert config.rate_limit_of("web") == 5
    assert config.rate_limit_of("server") == 0  # no limit for this one
    assert config.rate_limit_of("other") == 50
    assert load_settings().collector.rate_limit_burst == 20
    monkeypatch.setenv("EXACTLY_COLLECTOR__RATE_LIMITS", '{"web": -1}')
    with pytest.raises(ConfigError, match="negative"):
        load_settings()
