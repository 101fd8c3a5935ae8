"""Pure pieces of the log: the producer-sequence rule, the header codec, rowid ranges."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from exactly.log.base import Record, accept_sequences
from exactly.log.sqlite_format import OFFSET_BITS, decode_headers, encode_headers, partition_range

sequences = st.lists(st.integers(min_value=0, max_value=2**62), max_size=50)


@given(st.none() | st.integers(min_value=0, max_value=2**62), sequences)
def test_accepted_sequences_strictly_increase_above_last(last: int | None, seqs: list[int]) -> None:
    accepted, new_last = accept_sequences(last, seqs)
    kept = [s for s, ok in zip(seqs, accepted, strict=True) if ok]
    floor = -1 if last is None else last
    assert all(a < b for a, b in zip([floor, *kept], kept, strict=False))
    assert new_last == (kept[-1] if kept else last)
    # every refused record is at or below something stored before it
    for index, (seq, ok) in enumerate(zip(seqs, accepted, strict=True)):
        if not ok:
            before = [s for s, k in zip(seqs[:index], accepted[:index], strict=True) if k]
            assert seq <= max([floor, *before])


@given(sequences)
def test_resending_an_append_stores_nothing(seqs: list[int]) -> None:
    _, last = accept_sequences(None, seqs)
    accepted, again = accept_sequences(last, seqs)
    assert not any(accepted) and again == last


@given(
    st.lists(
        st.tuples(st.text(max_size=20), st.binary(max_size=100)).map(tuple),
        max_size=10,
    )
)
def test_headers_round_trip(headers: list[tuple[str, bytes]]) -> None:
    assert decode_headers(encode_headers(headers)) == tuple(headers)


def test_no_headers_stored_as_null() -> None:
    assert encode_headers(()) is None
    assert decode_headers(None) == ()


@given(st.integers(min_value=0, max_value=4095))
def test_partition_ranges_are_disjoint_and_adjacent(partition: int) -> None:
    low, high = partition_range(partition)
    assert high - low == 1 << OFFSET_BITS
    assert partition_range(partition + 1)[0] == high


def test_record_size_counts_key_value_headers() -> None:
    assert Record(b"abc", key=b"k", headers=(("h", b"12"),)).size == 3 + 1 + 1 + 2
