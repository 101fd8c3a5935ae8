"""Window arithmetic and verdict bookkeeping of the dedupe stores: pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.dedupe.base import Claim, Counters, fresh_counters
from exactly.dedupe.window import (
    Bounds,
    below_minimum,
    effective_window,
    keys_allowed,
    overflow,
    time_cutoff,
)
from exactly.errors import ConfigError
from exactly.events.ids import pack_id, pack_owner

counts = st.integers(min_value=0, max_value=10**9)
limits = st.none() | st.integers(min_value=1, max_value=10**9)


@given(limits, counts, counts)
def test_overflow_fits_the_batch_and_never_removes_more_than_is_kept(
    allowed: int | None, keys: int, incoming: int
) -> None:
    removed = overflow(allowed, keys, incoming)
    assert 0 <= removed <= keys
    if allowed is None:
        assert removed == 0
    elif removed < keys:
        assert keys - removed + incoming <= allowed
        assert removed == 0 or keys - removed + incoming == allowed  # no more than needed


@given(limits, limits, counts, counts)
def test_keys_allowed_is_the_tighter_bound(
    max_keys: int | None, max_bytes: int | None, keys: int, size: int
) -> None:
    allowed = keys_allowed(Bounds(max_keys, max_bytes), keys, size)
    if max_keys is None and max_bytes is None:
        assert allowed is None
    else:
        assert allowed is not None and allowed >= 1
        if max_keys is not None:
            assert allowed <= max_keys


def test_bytes_bound_uses_measured_bytes_per_key() -> None:
    assert keys_allowed(Bounds(max_bytes=100_000), keys=10_000, size=400_000) == 2_500
    assert (
        keys_allowed(Bounds(max_bytes=48_000), keys=10, size=10**9) == 1_000
    )  # too few to measure


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ConfigError):
        Bounds(max_keys=0)


@given(st.none() | st.integers(min_value=1, max_value=10**12), st.integers(0, 10**13))
def test_time_cutoff(window: int | None, newest: int) -> None:
    cutoff = time_cutoff(Bounds(window=window), newest)
    assert cutoff == (None if window is None else newest - window)


def test_effective_window_and_warning() -> None:
    assert effective_window(None, 100, True) is None
    assert effective_window(40, 100, False) is None  # nothing aged out: unbounded
    assert effective_window(40, 100, True) == 60
    assert below_minimum(60, 100) and not below_minimum(None, 100)
    assert not below_minimum(60, None) and not below_minimum(100, 100)


@given(
    st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["new", "own", "dup"])), max_size=40),
    st.none() | st.integers(0, 60),
)
def test_fresh_counters_count_only_offsets_at_or_past_the_position(
    rows: list[tuple[int, str]], position: int | None
) -> None:
    claims = [Claim(pack_id(f"m{o}"), pack_owner(0, o), 0) for o, _ in rows]
    owners = [
        None if kind == "new" else claim.owner if kind == "own" else pack_owner(0, 999)
        for claim, (_, kind) in zip(claims, rows, strict=True)
    ]
    got = fresh_counters(claims, owners, position)
    fresh = [kind for offset, kind in rows if position is None or offset >= position]
    assert got == Counters(len(fresh), fresh.count("new"), fresh.count("dup"))
