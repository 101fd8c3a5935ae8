"""Id and owner packing: pure functions, property tests."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exactly.errors import InvalidId
from exactly.events.ids import (
    MAX_OFFSET,
    MAX_PARTITION,
    owner_text,
    pack_id,
    pack_owner,
    unpack_owner,
    uuid_bytes,
)

uuids = st.uuids()
partitions = st.integers(min_value=0, max_value=MAX_PARTITION)
offsets = st.integers(min_value=0, max_value=MAX_OFFSET)


@given(uuids)
def test_a_uuid_in_every_spelling_packs_to_its_bytes(value: uuid.UUID) -> None:
    spellings = [str(value), value.hex, str(value).upper(), value.hex.upper(), f"ajs-{value.hex}"]
    for spelling in spellings:
        assert pack_id(spelling) == value.bytes
        assert pack_id(spelling.encode()) == value.bytes


@given(st.text(min_size=1))
def test_any_string_packs_to_16_bytes_and_str_and_utf8_agree(text: str) -> None:
    packed = pack_id(text)
    assert len(packed) == 16
    assert pack_id(text.encode()) == packed


@given(st.text(min_size=1).filter(lambda t: uuid_bytes(t) is None))
def test_other_strings_pack_to_their_blake2b_digest(text: str) -> None:
    assert pack_id(text) == hashlib.blake2b(text.encode(), digest_size=16).digest()


@given(uuids, uuids)
def test_distinct_uuids_never_collide(a: uuid.UUID, b: uuid.UUID) -> None:
    assert (pack_id(str(a)) == pack_id(b.hex)) == (a == b)


@given(st.sets(st.text(min_size=1), min_size=2, max_size=50))
def test_distinct_non_uuid_strings_do_not_collide(texts: set[str]) -> None:
    assert len({pack_id(t) for t in texts if uuid_bytes(t) is None}) == sum(
        1 for t in texts if uuid_bytes(t) is None
    )


@pytest.mark.parametrize(
    "text",
    [
        "0123456789abcdef0123456789abcdeg",  # not hex
        "0123456789abcdef 123456789abcdef",  # whitespace is not skipped
        "01234567-89ab-cdef-0123-456789abcde",  # one digit short
        "0123456789-ab-cdef-0123-456789abcdef",  # dashes in the wrong places
        "ajs-0123456789abcdef0123456789abcde",
        "ajs_0123456789abcdef0123456789abcdef",
        "{01234567-89ab-cdef-0123-456789abcdef}",
        "m-1",
        "é" * 16,
    ],
)
def test_near_misses_are_hashed(text: str) -> None:
    assert uuid_bytes(text) is None
    assert pack_id(text) == hashlib.blake2b(text.encode(), digest_size=16).digest()


def test_stable_across_releases() -> None:
    # fixed values: changing them would make every store on disk forget what it has seen
    assert pack_id("ajs-65707fcf61352427e8f1666f0e7f6090").hex() == (
        "65707fcf61352427e8f1666f0e7f6090"
    )
    assert pack_id("m-1").hex() == hashlib.blake2b(b"m-1", digest_size=16).hexdigest()
    assert pack_owner(1, 64942845052).hex() == "0001000f1ee52c7c"


def test_empty_id_is_refused() -> None:
    with pytest.raises(InvalidId):
        pack_id("")
    with pytest.raises(InvalidId):
        pack_id(b"")


@given(partitions, offsets)
def test_owner_round_trip_and_order(partition: int, offset: int) -> None:
    packed = pack_owner(partition, offset)
    assert len(packed) == 8
    assert unpack_owner(packed) == (partition, offset)
    assert owner_text(packed) == f"{partition}:{offset}"


@given(partitions, offsets, offsets)
def test_owners_of_one_partition_sort_by_offset(partition: int, a: int, b: int) -> None:
    assert (pack_owner(partition, a) < pack_owner(partition, b)) == (a < b)


@pytest.mark.parametrize(
    ("partition", "offset"), [(-1, 0), (MAX_PARTITION + 1, 0), (0, -1), (0, MAX_OFFSET + 1)]
)
def test_owner_out_of_range_is_refused(partition: int, offset: int) -> None:
    with pytest.raises(InvalidId):
        pack_owner(partition, offset)


def test_unpack_needs_8_bytes() -> None:
    with pytest.raises(InvalidId):
        unpack_owner(b"\x00" * 7)
