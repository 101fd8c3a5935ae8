"""Id and owner packing: pure functions, property tests."""

from __future__ import annotations

import hashlib
import json
import uuid

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactly.errors import InvalidId
from exactly.events.ids import (
    MAX_OFFSET,
    MAX_PARTITION,
    id_packer,
    ids_packer,
    offset_bytes,
    owner_offset,
    owner_offset_bytes,
    owner_text,
    pack_id,
    pack_ids,
    pack_owner,
    pack_owners,
    pack_source_id,
    parsed_source,
    partition_prefix,
    record_sources,
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


@given(partitions, offsets)
def test_an_owner_is_its_partition_prefix_and_offset_bytes(partition: int, offset: int) -> None:
    packed = pack_owner(partition, offset)
    assert pack_owners(partition, [offset, 0]) == [packed, pack_owner(partition, 0)]
    assert partition_prefix(partition) + offset_bytes(offset) == packed
    assert owner_offset_bytes(packed) == offset_bytes(offset)
    assert owner_offset(packed) == offset


def test_owners_packed_together_check_their_partition_and_every_offset() -> None:
    assert pack_owners(3, []) == []
    with pytest.raises(InvalidId):
        pack_owners(MAX_PARTITION + 1, [0])
    with pytest.raises(InvalidId, match=str(MAX_OFFSET + 1)):
        pack_owners(0, [0, MAX_OFFSET + 1, 5])
    with pytest.raises(InvalidId, match="-1"):
        pack_owners(0, [4, -1])


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


# -- scopes: (source, messageId) keys and the source of a record --------------------------------

sources = st.text(max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
events = st.dictionaries(st.text(max_size=12), json_values, max_size=6)


def layout(source: str, message_id: str) -> bytes:
    """The rule of the module docstring, written out: BLAKE2b-128 of length, source, packed id."""
    raw = source.encode()
    data = len(raw).to_bytes(4, "big") + raw + pack_id(message_id)
    return hashlib.blake2b(data, digest_size=16, person=b"exactly.source").digest()


@given(sources, st.text(min_size=1))
def test_a_scoped_id_is_16_bytes_of_the_documented_layout(source: str, message_id: str) -> None:
    packed = pack_source_id(source, message_id)
    assert len(packed) == 16
    assert packed == layout(source, message_id)
    assert pack_source_id(source.encode(), message_id.encode()) == packed
    assert id_packer("source")(source.encode(), message_id.encode()) == packed
    assert id_packer("workspace")(source.encode(), message_id.encode()) == pack_id(message_id)


@given(sources, sources, st.text(min_size=1), st.text(min_size=1))
def test_scoped_ids_differ_when_source_or_message_id_differ(a: str, b: str, m: str, n: str) -> None:
    same = a == b and pack_id(m) == pack_id(n)
    assert (pack_source_id(a, m) == pack_source_id(b, n)) == same


@given(sources, uuids)
def test_a_uuid_in_every_spelling_is_one_id_within_a_source(source: str, value: uuid.UUID) -> None:
    spellings = [str(value), value.hex.upper(), f"ajs-{value.hex}"]
    assert len({pack_source_id(source, s) for s in spellings}) == 1


def test_the_source_boundary_is_unambiguous() -> None:
    # without the length prefix these would hash the same bytes
    a = pack_id("m-1")
    assert pack_source_id("web", "m-1") != pack_source_id("we", "m-1")
    assert pack_source_id("web" + a.decode("latin-1"), "m-1") != pack_source_id("web", "m-1")
    assert pack_source_id("", "m-1") != pack_id("m-1")


def test_scoped_ids_are_stable_across_releases() -> None:
    # fixed values: changing them would make every store on disk forget what it has seen
    assert pack_source_id("web", "ajs-65707fcf61352427e8f1666f0e7f6090").hex() == (
        "3960a7eda5969c8f34b75b0ed9529416"
    )


def test_an_unknown_scope_is_refused() -> None:
    with pytest.raises(InvalidId, match="use one of source, workspace"):
        id_packer("tenant")


@settings(deadline=None)  # the first call imports pyarrow.compute
@given(events, sources)
def test_the_collectors_layout_gives_its_source_without_parsing(
    event: dict[str, object], source: str
) -> None:
    event.pop("sourceId", None)
    value = orjson.dumps({**event, "sourceId": source})  # what normalise writes: sourceId last
    assert record_sources([value]) == [source.encode()] == [parsed_source(value)]


@settings(deadline=None)
@given(events, json_values, st.booleans())
def test_any_json_gets_the_source_a_parser_sees(
    event: dict[str, object], decoy: object, spaced: bool
) -> None:
    # sourceId anywhere, nested decoys, keys that end like it: the tail never fools the rule
    values = [
        orjson.dumps({**event, "x": {"sourceId": decoy}}),
        orjson.dumps({"sourceId": "real", **event, '"sourceId': "victim"}),
        orjson.dumps({"sourceId": "real", **event, "y": ',"sourceId":"victim"}'}),
        json.dumps(
            {**event, "sourceId": decoy}, separators=None if spaced else (",", ":")
        ).encode(),
        orjson.dumps([event, {"sourceId": "victim"}]),
    ]
    assert record_sources(values) == [parsed_source(v) for v in values]
    assert record_sources(pa.array(values, pa.binary())) == [parsed_source(v) for v in values]


@pytest.mark.parametrize(
    ("value", "source"),
    [
        (b'{"messageId":"m","sourceId":"web"}', b"web"),
        (b'{"sourceId":"caf\\u00e9"}', "café".encode()),
        (b'{"sourceId":7}', b""),
        (b'{"messageId":"m"}', b""),
        (b"not json", b""),
        (b"", b""),
        (b'["sourceId"]', b""),
        (b'{"a":' * 2000 + b"1" + b"}" * 2000, b""),  # deeper than any parser: no crash
        (b'{"p":' + b"[" * 300 + b"]" * 300 + b',"sourceId":"web"}', b"web"),
    ],
)
def test_sources_of_odd_values(value: bytes, source: bytes) -> None:
    assert record_sources([value]) == [source]


def _spellings(value: uuid.UUID) -> list[bytes]:
    text = str(value)
    return [
        text.encode(),
        text.upper().encode(),
        text.replace("-", "").encode(),
        f"ajs-{value.hex}".encode(),
    ]


# Ids as a task meets them: dashed UUIDs mostly, other spellings, 36-byte near misses, anything.
task_ids = st.one_of(
    st.uuids().map(lambda u: str(u).encode()),
    st.uuids().flatmap(lambda u: st.sampled_from(_spellings(u))),
    st.uuids().map(lambda u: (str(u)[:8] + "_" + str(u)[9:]).encode()),  # a dash replaced
    st.uuids().map(lambda u: str(u).replace("a", "g").replace("b", "G").encode()),  # not hex
    st.binary(min_size=36, max_size=36),
    st.text(min_size=1).map(str.encode),
)


@given(st.lists(task_ids, max_size=40))
def test_a_batch_packs_as_each_id_alone(message_ids: list[bytes]) -> None:
    assert pack_ids(message_ids) == [pack_id(m) for m in message_ids]


@given(st.lists(st.uuids().map(lambda u: str(u).encode()), min_size=1, max_size=40), task_ids)
def test_a_batch_of_dashed_uuids_with_one_other_id_packs_as_each_alone(
    message_ids: list[bytes], other: bytes
) -> None:
    mixed = [*message_ids[:1], other, *message_ids[1:]]
    assert pack_ids(mixed) == [pack_id(m) for m in mixed]


@given(
    st.lists(st.tuples(sources, task_ids), max_size=20), st.sampled_from(["source", "workspace"])
)
def test_the_batch_packer_of_a_scope_agrees_with_its_packer(
    rows: list[tuple[str, bytes]], scope: str
) -> None:
    found = ids_packer(scope)([s.encode() for s, _ in rows], [m for _, m in rows])
    assert found == [id_packer(scope)(s.encode(), m) for s, m in rows]


def test_an_empty_id_in_a_batch_is_refused() -> None:
    with pytest.raises(InvalidId):
        pack_ids([str(uuid.uuid4()).encode(), b""])
