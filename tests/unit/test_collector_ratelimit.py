"""GCRA rate limits (pure): property tests of what a client may send, and the bounded table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.collector.ratelimit import Rate, RateLimiter, client_key, gcra
from exactly.config import load_settings
from exactly.errors import ConfigError

RATES = st.builds(
    Rate,
    per_second=st.floats(min_value=0.1, max_value=1000, allow_nan=False),
    burst=st.integers(min_value=1, max_value=100),
)
GAPS = st.lists(st.floats(min_value=0, max_value=2, allow_nan=False), min_size=1, max_size=300)


def arrivals(gaps: list[float]) -> list[float]:
    times, now = [], 1000.0
    for gap in gaps:
        now += gap
        times.append(now)
    return times


@given(rate=RATES, gaps=GAPS)
def test_no_window_admits_more_than_burst_plus_rate_times_its_length(
    rate: Rate, gaps: list[float]
) -> None:
    tat, allowed = 0.0, []
    for now in arrivals(gaps):
        tat, wait = gcra(tat, now, rate)
        if not wait:
            allowed.append(now)
    for i, start in enumerate(allowed):
        for j in range(i, len(allowed)):
            window = allowed[j] - start
            assert j - i + 1 <= rate.burst + window * rate.per_second + 1e-6


@given(rate=RATES, count=st.integers(min_value=1, max_value=300))
def test_a_client_within_its_rate_is_never_refused(rate: Rate, count: int) -> None:
    tat, now = 0.0, 50.0
    for _ in range(count):
        tat, wait = gcra(tat, now, rate)
        assert wait == 0
        now += rate.interval * 1.000001


@given(rate=RATES)
def test_a_burst_is_taken_at_once_then_the_client_waits_what_it_is_told(rate: Rate) -> None:
    tat, now = 0.0, 7.0
    for _ in range(rate.burst):
        tat, wait = gcra(tat, now, rate)
        assert wait == 0
    refused_tat, wait = gcra(tat, now, rate)
    assert wait > 0 and refused_tat == tat  # a refusal costs the client nothing more
    assert gcra(tat, now + wait, rate)[1] == 0


@given(rate=RATES, gaps=GAPS)
def test_a_refused_request_is_allowed_after_its_wait(rate: Rate, gaps: list[float]) -> None:
    tat = 0.0
    for now in arrivals(gaps):
        new_tat, wait = gcra(tat, now, rate)
        if wait:
            assert gcra(tat, now + wait, rate)[1] == 0
        else:
            tat = new_tat


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
