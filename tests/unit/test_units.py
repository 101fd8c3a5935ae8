"""Durations and sizes as settings and flags write them: pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import ConfigError
from exactly.units import MS, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("24h", 86_400_000),
        ("7d", 7 * 86_400_000),
        ("90m", 5_400_000),
        ("1h30m", 5_400_000),
        ("1.5h", 5_400_000),
        ("2w", 2 * 604_800_000),
        ("250ms", 250),
        (" 10 S ", 10_000),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "1x", "1h 2", "0s", "1h-2m"])
def test_parse_duration_refuses_nonsense_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--window"):
        parse_duration(text, "--window")


@given(st.integers(min_value=1000, max_value=10**13))
def test_format_then_parse_is_close(ms: int) -> None:
    text = format_duration(ms)
    parsed = parse_duration(text.replace(" ", ""))
    assert parsed <= ms
    largest = max(MS[unit] for unit in "wdhms" if MS[unit] <= ms)
    assert ms - parsed < largest  # two units at most: the error is below the largest one
