"""Properties of the many-directors policy: partition of a bucket, fair share, portions."""

from __future__ import annotations

import math
import subprocess
import sys
import zlib

from hypothesis import given
from hypothesis import strategies as st

from exactly.delivery.jobdb.base import bucket_of, lane_of, split_bucket
from exactly.delivery.partitions import (
    fair_share,
    partition_of,
    portion,
    probe_order,
    rate_portion,
    to_release,
)

buckets = st.text(min_size=1, max_size=40).map(lambda s: f"{s}/dest")
counts = st.integers(min_value=1, max_value=256)


@given(buckets, counts)
def test_a_bucket_is_in_one_partition_in_range_and_always_the_same(
    bucket: str, partitions: int
) -> None:
    assert 0 <= partition_of(bucket, partitions) < partitions
    assert partition_of(bucket, partitions) == partition_of(bucket, partitions)
    assert partition_of(bucket, 1) == 0


def test_the_partition_is_the_same_in_another_process() -> None:
    """Not Python's salted hash(): another interpreter agrees (every director must)."""
    names = [f"source-{i}/hook" for i in range(50)]
    code = (
        "from exactly.delivery.partitions import partition_of\n"
        f"print([partition_of(n, 7) for n in {names!r}])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([partition_of(n, 7) for n in names])
    assert partition_of("web/hook", 8) == 7  # fixed: a change would move every bucket


def test_buckets_spread_over_the_partitions() -> None:
    seen = [partition_of(f"source-{i}/hook", 8) for i in range(800)]
    assert all(60 <= seen.count(p) <= 140 for p in range(8))


@given(counts, st.integers(min_value=1, max_value=64))
def test_fair_shares_cover_every_partition(partitions: int, directors: int) -> None:
    share = fair_share(partitions, directors)
    assert share * directors >= partitions  # no partition needs to stay free
    assert share == max(1, math.ceil(partitions / directors))
    assert (share - 1) * directors < partitions or share == 1  # no more than needed


@given(st.sets(st.integers(0, 63)), st.integers(1, 64))
def test_release_brings_a_director_down_to_its_share_keeping_partition_0(
    held: set[int], share: int
) -> None:
    gone = to_release(held, share)
    assert set(gone) <= held and 0 not in gone
    kept = held - set(gone)
    assert len(kept) == min(len(held), share)
    assert all(p > q for p in gone for q in kept if q != 0)  # the highest go first


@given(counts, st.integers(0, 1000))
def test_probe_order_visits_each_partition_once(partitions: int, start: int) -> None:
    order = probe_order(partitions, start % partitions)
    assert sorted(order) == list(range(partitions)) and order[0] == start % partitions


@given(st.integers(1, 200), st.sets(st.integers(0, 31), min_size=1), st.integers(1, 8))
def test_portions_of_a_limit_add_up_to_it(total: int, spread: set[int], directors: int) -> None:
    """The destination's partitions dealt among directors: the portions sum to the limit
    when it is at least the partitions; below that each director still gets 1, so the sum
    may pass the limit by at most the directors but one."""
    order = sorted(spread)
    owners = [set(order[i::directors]) for i in range(directors)]
    owners = [mine for mine in owners if mine]
    parts = [portion(total, mine, spread) for mine in owners]
    assert all(part >= 1 for part in parts)
    assert sum(parts) <= total + len(owners) - 1
    if total >= len(spread):
        assert sum(parts) == total
    assert portion(total, set(spread), spread) == total
    assert portion(total, set(), ()) == total  # no buckets anywhere: the whole limit


@given(
    st.floats(0.5, 1000),
    st.sets(st.integers(0, 31), min_size=1),
    st.integers(1, 8),
)
def test_rate_portions_add_up_to_the_rate(rate: float, spread: set[int], directors: int) -> None:
    order = sorted(spread)
    owners = [set(order[i::directors]) for i in range(directors)]
    rates = [rate_portion(rate, mine, spread) for mine in owners if mine]
    assert math.isclose(sum(r for r in rates if r is not None), rate)
    assert rate_portion(None, {1}, spread) is None


def test_a_destinations_lanes_sit_on_consecutive_partitions() -> None:
    """Lane k of a bucket is k partitions on from lane 0, so up to ``partitions`` lanes are on
    as many partitions and two directors holding four of eight each get four lanes."""
    first = partition_of("web/hook", 8)
    lanes = [partition_of(bucket_of("web", "hook", lane), 8) for lane in range(8)]
    assert lanes == [(first + lane) % 8 for lane in range(8)]
    assert split_bucket("web/3/hook") == ("web/hook", 3)
    assert split_bucket("web/hook") == ("web/hook", 0)
    assert split_bucket("a/b/c") == ("a/b/c", 0)  # not a lane: a name of its own
    assert sorted(lanes) == list(range(8))  # one lane a partition, whoever holds which


def test_a_users_jobs_keep_one_lane_and_users_spread_over_the_lanes() -> None:
    assert lane_of("user-1", 8) == lane_of("user-1", 8)
    assert lane_of(None, 8) == lane_of("", 8) == lane_of("user-1", 1) == 0
    seen = [lane_of(f"user-{i}", 8) for i in range(8000)]
    assert all(850 <= seen.count(lane) <= 1150 for lane in range(8))
    # CRC-32, not the salted hash(): another process puts a user in the same lane
    assert lane_of("user-1", 8) == zlib.crc32(b"user-1") % 8
