"""Window arithmetic and verdict bookkeeping of the dedupe stores: pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.dedupe.base import Claim, Counters, fresh_counters
from exactly.dedupe.window import (
    GENERATIONS,
    Bounds,
    Generation,
    below_minimum,
    effective_window,
    generation_sizes,
    generations_to_drop,
    keys_allowed,
    opens_generation,
    time_cutoff,
)
from exactly.errors import ConfigError
from exactly.events.ids import pack_id, pack_owner

counts = st.integers(min_value=0, max_value=10**9)
limits = st.none() | st.integers(min_value=1, max_value=10**9)


times = st.integers(min_value=0, max_value=10**12)
generation_lists = st.lists(
    st.tuples(st.integers(min_value=0, max_value=10**6), times, times), max_size=12
).map(
    lambda found: tuple(
        Generation(number, keys, min(a, b), max(a, b)) for number, (keys, a, b) in enumerate(found)
    )
)


@given(generation_lists, limits, counts, st.none() | times)
def test_generations_to_drop_are_the_oldest_whole_ones_and_never_the_newest(
    live: tuple[Generation, ...], allowed: int | None, incoming: int, cutoff: int | None
) -> None:
    dropped = generations_to_drop(live, allowed, incoming, cutoff)
    assert 0 <= dropped <= max(0, len(live) - 1)
    kept = live[dropped:]
    if dropped < len(live) - 1:  # stopped early: what is kept fits and is recent enough
        assert allowed is None or sum(g.keys for g in kept) + incoming <= allowed
        assert cutoff is None or kept[0].newest >= cutoff
    if dropped:  # and each dropped one had to go: over the bound or older than the window
        before = live[dropped - 1 :]
        over = allowed is not None and sum(g.keys for g in before) + incoming > allowed
        assert over or (cutoff is not None and live[dropped - 1].newest < cutoff)


@given(counts, st.none() | st.integers(min_value=1, max_value=10**6), counts)
def test_generation_sizes_fill_the_current_one_then_steps_of_new_ones(
    keys: int, step: int | None, count: int
) -> None:
    sizes = generation_sizes(keys, step, count)
    assert sum(sizes) == count and all(size >= 0 for size in sizes)
    if step is None:
        assert sizes == [count]
        return
    assert sizes[0] == min(count, max(0, step - keys))
    new = sizes[1:]
    assert len(new) <= GENERATIONS and all(size > 0 for size in new)
    if count - sizes[0] <= step * GENERATIONS:  # all full but the newest
        assert all(size == step for size in new[:-1]) and (not new or new[-1] <= step)
    else:  # the excess in the oldest new one, the newest ones full
        assert len(new) == GENERATIONS
        assert new[0] > step and all(size == step for size in new[1:])


def test_a_call_far_larger_than_the_bound_keeps_its_newest_ids_in_full_steps() -> None:
    assert generation_sizes(0, 12, 260, most=8) == [12, 164, 12, 12, 12, 12, 12, 12, 12]
    assert generation_sizes(5, 10, 27) == [5, 10, 10, 2]
    assert generation_sizes(10, 10, 0) == [0]
    # exactly eight new generations, the newest partial: no excess to put in the oldest
    assert generation_sizes(0, 10, 85) == [10, 10, 10, 10, 10, 10, 10, 10, 5]


def test_a_generation_is_full_at_an_eighth_of_the_bounds() -> None:
    current = Generation(3, keys=124, earliest=10_000, newest=10_500)
    assert opens_generation(None, None, None, newest=0)
    assert not opens_generation(current, allowed=1_000, window=None, newest=99_999)
    assert opens_generation(replace(current, keys=125), allowed=1_000, window=None, newest=0)
    assert not opens_generation(current, allowed=None, window=8_000, newest=10_999)
    assert opens_generation(current, allowed=None, window=8_000, newest=11_000)
    assert not opens_generation(replace(current, keys=10**9), None, None, newest=10**12)


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
