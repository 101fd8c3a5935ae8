"""The sqlite log's record batches as bytes: packing, decoding and splitting (pure functions)."""

from __future__ import annotations

import struct
import zlib

from hypothesis import given
from hypothesis import strategies as st

from exactly.log import Record
from exactly.log.sqlite_format import (
    BATCH_BYTES,
    batched,
    decode_records,
    pack_records,
)

headers = st.lists(st.tuples(st.text(max_size=20), st.binary(max_size=30)), max_size=3).map(tuple)
records = st.builds(
    Record,
    value=st.binary(max_size=200),
    key=st.none() | st.binary(max_size=40),
    headers=headers,
    timestamp=st.none() | st.integers(-(2**63), 2**63 - 1),
)


@given(st.lists(records, max_size=30), st.integers(0, 2**40), st.data())
def test_a_batch_decodes_to_its_records_from_any_skip(
    batch: list[Record], stamp: int, data: st.DataObject
) -> None:
    blob, hashes = pack_records(batch, stamp)
    skip = data.draw(st.integers(0, len(batch)))
    count = data.draw(st.integers(0, len(batch) + 2))
    with_headers = data.draw(st.booleans())
    decoded, content = decode_records(blob, 3, 100 + skip, skip, count, with_headers)
    expected = batch[skip : skip + count]
    assert [(r.partition, r.offset) for r in decoded] == [
        (3, 100 + skip + n) for n in range(len(expected))
    ]
    for record, got in zip(expected, decoded, strict=True):
        assert (got.key, got.value) == (record.key, record.value)
        assert got.headers == (tuple(record.headers) if with_headers else ())
        assert got.timestamp == (stamp if record.timestamp is None else record.timestamp)
    assert content == sum(len(r.value) + len(r.key or b"") for r in expected)
    keys = [record.key for record in batch if record.key is not None]
    expected_hashes = struct.pack(f"<{len(keys)}I", *map(zlib.crc32, keys)) if keys else None
    assert hashes == expected_hashes


@given(st.lists(st.integers(0, BATCH_BYTES // 3), max_size=20))
def test_appends_are_cut_into_batches_of_about_batch_bytes_in_order(sizes: list[int]) -> None:
    appended = [Record(b"v" * size, b"k%d" % n) for n, size in enumerate(sizes)]
    cut = list(batched(appended))
    assert [record for batch in cut for record in batch] == appended
    assert all(cut)
    for batch in cut[:-1]:  # each full batch crossed the size with its last record, not before
        sizes_of = [len(r.value) + len(r.key or b"") for r in batch]
        assert sum(sizes_of) >= BATCH_BYTES > sum(sizes_of[:-1])
