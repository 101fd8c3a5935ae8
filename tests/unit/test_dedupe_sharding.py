"""Where the redis store puts ids: hashes, slots, epochs and positions (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.dedupe.redis.sharding import (
    Epoch,
    Sharding,
    bucket_ttl,
    id_hash,
    id_hashes,
    lookup_slots,
    parse_cutover,
    parse_urls,
    partition_position,
    sharding_from,
    sharding_from_url,
)
from exactly.errors import ConfigError

A, B, C = "redis://a:6379/0", "redis://b:6379/0", "redis://c:6379/0"
HOUR = 3_600_000
times = st.integers(min_value=0, max_value=2**44)


@settings(deadline=None)  # the first example imports numpy
@given(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=50))
def test_the_vectorised_hash_is_the_scalar_one(ids: list[bytes]) -> None:
    assert [int(h) for h in id_hashes(b"".join(ids))] == [id_hash(i) for i in ids]


def test_ids_ordered_in_time_spread_over_buckets_and_shards() -> None:
    ids = [(n << 64 | 0xABCDEF).to_bytes(16, "big") for n in range(20_000)]  # like UUIDv7
    buckets = {id_hash(i) & 0xFFFFFFFF for i in ids}
    per_shard = [sum(1 for i in ids if (id_hash(i) >> 32) % 3 == k) for k in range(3)]
    assert len({b % 64 for b in buckets}) == 64
    assert min(per_shard) > 6_000


@given(times, st.integers(min_value=0, max_value=10 * HOUR), st.integers(1, 10 * HOUR))
def test_a_lookup_reads_the_slot_of_every_id_received_within_the_window(
    first: int, gap: int, window: int
) -> None:
    epoch = Epoch((A,), slot_ms=HOUR)
    sharding = Sharding(epoch)
    later = first + min(gap, window)
    slots = lookup_slots(sharding, epoch, later - window, later + HOUR)
    assert epoch.slot(first) in slots


@given(times, st.integers(0, 10 * HOUR), st.integers(-10 * HOUR, 10 * HOUR), st.integers(1, HOUR))
def test_epochs_split_the_lookups_at_the_cutover(
    first: int, gap: int, shift: int, window: int
) -> None:
    later = first + min(gap, window)
    cutover = first + shift
    sharding = Sharding(Epoch((A, B, C)), Epoch((A, B), slot_ms=HOUR), cutover)
    placed = sharding.epoch_at(first)
    assert placed is (sharding.previous if first < cutover else sharding.current)
    assert placed in sharding.in_play(later - window)
    assert placed.slot(first) in lookup_slots(sharding, placed, later - window, later)


def test_bucket_ttl_lasts_a_window_and_a_slot_past_the_slot() -> None:
    epoch = Epoch((A,), slot_ms=HOUR)
    assert bucket_ttl(epoch, slot=10, window=24 * HOUR, newest=10 * HOUR) == 26 * HOUR
    assert bucket_ttl(epoch, slot=10, window=HOUR, newest=100 * HOUR) == 1000  # long gone


def test_the_position_is_the_least_of_the_shards_in_play() -> None:
    one = Sharding(Epoch((A, B)))
    assert partition_position(one, {A: 10, B: 12}, 5, HOUR) == 10
    assert partition_position(one, {A: 10, B: None}, 5, HOUR) is None  # B was flushed
    assert partition_position(one, {A: None, B: None}, None, HOUR) is None
    resharded = Sharding(Epoch((A, B, C)), Epoch((A, B)), cutover=100 * HOUR)
    # C is new: empty until records received after the cutover reach it
    assert partition_position(resharded, {A: 10, B: 12, C: None}, 99 * HOUR, HOUR) == 10
    assert partition_position(resharded, {A: 10, B: 12, C: None}, 100 * HOUR, HOUR) is None
    # once the window is past the cutover, only the current shards count
    gone = Sharding(Epoch((C,)), Epoch((A,)), cutover=100 * HOUR)
    assert partition_position(gone, {A: None, C: 7}, 102 * HOUR, HOUR) == 7
    assert partition_position(gone, {A: None, C: 7}, 100 * HOUR, HOUR) is None


def test_servers_and_options_from_a_store_url() -> None:
    assert parse_urls([f"{A},{B}", C, A]) == (A, B, C)
    with pytest.raises(ConfigError, match="redis://"):
        parse_urls("localhost:6379")
    assert parse_cutover("2026-11-22T10:00Z") == 1_795_341_600_000
    assert parse_cutover("1795341600000") == 1_795_341_600_000
    with pytest.raises(ConfigError, match="time zone"):
        parse_cutover("2026-11-22T10:00")
    with pytest.raises(ConfigError, match="cutover"):
        sharding_from(A, previous=B)
    with pytest.raises(ConfigError, match="at least one"):
        sharding_from(None)
    sharding, namespace = sharding_from_url(
        "redis://a:6379,b:6379,c:6379/0?previous=a:6379,b:6379&cutover=2026-11-22T10:00Z"
        "&slot=1h&namespace=ns:raw"
    )
    assert namespace == "ns:raw"
    assert sharding.current == Epoch((A, B, C), slot_ms=HOUR)
    assert sharding.previous == Epoch((A, B), slot_ms=HOUR)
    assert sharding.cutover == 1_795_341_600_000
    assert sharding.servers == (A, B, C)
    with pytest.raises(ConfigError, match="unknown option 'shards'"):
        sharding_from_url("redis://a:6379/0?shards=2")
