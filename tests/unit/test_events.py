from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from exactly.events import partition_for


@given(st.text(min_size=1), st.integers(min_value=1, max_value=4096))
def test_partition_in_range_and_str_bytes_agree(key: str, partitions: int) -> None:
    partition = partition_for(key, partitions)
    assert 0 <= partition < partitions
    assert partition_for(key.encode(), partitions) == partition


def test_partition_is_stable_across_releases() -> None:
    # fixed values: changing the function would move every messageId to another partition
    assert [partition_for(f"m-{n}", 16) for n in range(8)] == [4, 5, 14, 0, 8, 15, 9, 5]
    assert partition_for("ajs-next-0123456789abcdef", 1024) == 904


def test_partitions_are_balanced() -> None:
    counts = Counter(partition_for(f"id-{n}", 8) for n in range(80_000))
    assert min(counts.values()) > 9_000 and max(counts.values()) < 11_000
