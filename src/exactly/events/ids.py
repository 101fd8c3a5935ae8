"""Id and owner packing for the dedupe stores (DESIGN.md "Deduplication"): pure functions.

A dedupe store keeps ``messageId -> owner`` for millions of ids, so both sides are packed small:

* **Ids to 16 bytes.** A UUID, with or without dashes, in either case, and Segment's browser form
  ``ajs-`` + 32 hex digits, are stored as their 16 bytes. Any other string is stored as its
  128-bit BLAKE2b digest (a collision needs about 2**64 ids, far beyond any window). The one
  consequence to know: the same UUID written two ways (dashed and plain, upper and lower case,
  with ``ajs-``) packs to the same id. Such spellings are different strings, so the partitioner
  usually puts them in different partitions, and a store only ever compares ids of one partition.
* **Scoped by source.** Dedupe keeps one messageId per *scope* (:data:`SCOPES`). With
  ``workspace`` the packed messageId is the key, so every source shares one id space. With
  ``source`` (the default) the key is :func:`pack_source_id`: the 128-bit BLAKE2b digest
  (personalised ``exactly.source``) of the source's UTF-8 length (4 bytes, big-endian), the
  source, and the packed messageId (16 bytes). The length prefix makes the input unambiguous, so
  a source reaches another source's key only by a second preimage of BLAKE2b (about 2**128
  tries): a holder of one write key cannot suppress another source's events by sending its ids
  first. The same UUID spelled two ways is still one id within a source.
* **The source of a record** (:func:`record_sources`) is the ``sourceId`` string at the top of
  its JSON, as the collector sets it from the write key; ``""`` when there is none (not JSON, not
  an object, no ``sourceId``, or not a string), so records written by other tools share the
  source ``""``.
* **Owners to 8 bytes.** The owner of an id is the raw record that claimed it first: a 2-byte
  partition and a 6-byte offset, big-endian (Tapjoy's layout). 2**48 offsets per partition is
  beyond any log's life, so the offset never wraps in practice. A store of one partition may
  keep only the offset part (:func:`owner_offset_bytes`) and join it back to the partition's
  :func:`partition_prefix`; :func:`pack_owners` packs many offsets of one partition.

Everything here is pure and deterministic across processes and machines.
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import orjson

from exactly.errors import ConfigError, InvalidId

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

Scope = Literal["source", "workspace"]
SCOPES: tuple[Scope, ...] = ("source", "workspace")
DEFAULT_SCOPE: Scope = "source"
SOURCE_FIELD = "sourceId"

ID_BYTES = 16
PARTITION_BYTES, OFFSET_BYTES = 2, 6
OWNER_BYTES = PARTITION_BYTES + OFFSET_BYTES
MAX_PARTITION = 0xFFFF
MAX_OFFSET = (1 << 48) - 1

_DASHES = (8, 13, 18, 23)
_SOURCE_PERSON = b"exactly.source"
# The collector's own layout (orjson, sourceId set last): ``...,"sourceId":"web"}``. In valid JSON
# such a tail can only be the top-level sourceId (the member before the closing brace, its key
# opened after a comma or the opening brace, its value a string without escapes). RE2 runs an
# end-anchored pattern backwards from the end, so the cost does not grow with the value.
_SOURCE_TAIL = r'[,{]"sourceId":"(?P<source>[^"\\]*)"}\z'


def _hex16(text: bytes) -> bytes | None:
    """The 16 bytes of 32 hex digits, None if ``text`` is anything else."""
    if len(text) != 32:
        return None
    try:
        return binascii.unhexlify(text)
    except binascii.Error:
        return None


def uuid_bytes(message_id: str | bytes) -> bytes | None:
    """The 16 bytes of ``message_id`` if it is a UUID (dashed or not) or ``ajs-`` + 32 hex."""
    raw = message_id.encode() if isinstance(message_id, str) else message_id
    size = len(raw)
    if size == 32:
        return _hex16(raw)
    if size == 36:
        if raw[8] == raw[13] == raw[18] == raw[23] == 0x2D:  # '-'
            return _hex16(raw[:8] + raw[9:13] + raw[14:18] + raw[19:23] + raw[24:])
        if raw[:4] == b"ajs-":
            return _hex16(raw[4:])
    return None


def pack_id(message_id: str | bytes) -> bytes:
    """A messageId as the 16 bytes a store keeps (see the module docstring).

    ``bytes`` are the UTF-8 of the id (a log record's key), and give the same result as the
    ``str``. An empty id is refused with :class:`~exactly.errors.InvalidId`.
    """
    raw = message_id.encode() if isinstance(message_id, str) else message_id
    if not raw:
        raise InvalidId("a messageId is a non-empty string")
    packed = uuid_bytes(raw)
    if packed is not None:
        return packed
    return hashlib.blake2b(raw, digest_size=ID_BYTES).digest()


@lru_cache(maxsize=4096)
def _source_prefix(source: bytes) -> hashlib.blake2b:
    return hashlib.blake2b(
        len(source).to_bytes(4, "big") + source, digest_size=ID_BYTES, person=_SOURCE_PERSON
    )


def pack_source_id(source: str | bytes, message_id: str | bytes) -> bytes:
    """``(source, messageId)`` as 16 bytes: the key of scope ``source`` (module docstring).

    ``source`` may be empty (records without a ``sourceId``); the messageId may not.
    """
    raw = source.encode() if isinstance(source, str) else source
    return _scoped(raw, pack_id(message_id))


# A dashed UUID's 32 hex digits, by position, and each byte's value as a hex digit (16: not one).
_UUID_DIGITS = [*range(8), *range(9, 13), *range(14, 18), *range(19, 23), *range(24, 36)]
_DASH_POSITIONS = list(_DASHES)
_HEX_VALUES = bytes(
    int(chr(b), 16) if chr(b) in "0123456789abcdefABCDEF" else 16 for b in range(256)
)


def pack_ids(message_ids: Sequence[bytes]) -> list[bytes]:
    """:func:`pack_id` of each id, the dashed UUIDs of a batch decoded together in numpy.

    A task's keys are nearly always dashed UUIDs (every SDK's messageId): one pass over the
    batch's digits costs 0.09 µs an id against 0.7 for :func:`pack_id`. Any other id (of another
    length, ``ajs-``, a digit that is not hex) is packed by :func:`pack_id`, so the result is the
    same byte for byte.
    """
    import numpy as np

    if set(map(len, message_ids)) != {36}:
        return [pack_id(message_id) for message_id in message_ids]
    count = len(message_ids)
    digits = np.frombuffer(b"".join(message_ids), np.uint8).reshape(count, 36)
    values = np.frombuffer(_HEX_VALUES, np.uint8)[digits[:, _UUID_DIGITS]]
    usable = (digits[:, _DASH_POSITIONS] == ord("-")).all(axis=1) & (values < 16).all(axis=1)
    packed = ((values[:, 0::2] << 4) | values[:, 1::2]).tobytes()
    found = [packed[at : at + ID_BYTES] for at in range(0, count * ID_BYTES, ID_BYTES)]
    for index in np.flatnonzero(~usable).tolist():
        found[index] = pack_id(message_ids[index])
    return found


def _scoped(source: bytes, packed: bytes) -> bytes:
    """The key of scope ``source`` for a packed messageId (:func:`pack_source_id`)."""
    state = _source_prefix(source).copy()
    state.update(packed)
    return state.digest()


def _scoped_ids(sources: Sequence[bytes], packed: list[bytes]) -> list[bytes]:
    """:func:`_scoped` of each packed messageId, the source's hash state copied per id."""
    if len(set(sources)) != 1:
        return list(map(_scoped, sources, packed))
    state = _source_prefix(sources[0])  # one source, the usual case: looked up once
    keys = []
    for found in packed:
        copy = state.copy()
        copy.update(found)
        keys.append(copy.digest())
    return keys


def check_scope(scope: str) -> None:
    """:class:`~exactly.errors.ConfigError` naming the choices when ``scope`` is none of
    :data:`SCOPES` (a setting, a flag)."""
    if scope not in SCOPES:
        raise ConfigError(f"dedupe scope {scope!r}: use one of {', '.join(SCOPES)}")


def ids_packer(scope: str) -> Callable[[Sequence[bytes], Sequence[bytes]], list[bytes]]:
    """:func:`id_packer` for a whole batch: ``(sources, messageIds) -> keys``, in order."""
    if scope == "source":
        return lambda sources, message_ids: _scoped_ids(sources, pack_ids(message_ids))
    if scope == "workspace":
        return lambda _sources, message_ids: pack_ids(message_ids)
    raise InvalidId(f"dedupe scope {scope!r}: use one of {', '.join(SCOPES)}")


def id_packer(scope: str) -> Callable[[bytes, bytes], bytes]:
    """``(source, messageId) -> key`` for ``scope``: the one rule every store and rebuild uses."""
    if scope == "source":
        return pack_source_id
    if scope == "workspace":
        return lambda _source, message_id: pack_id(message_id)
    raise InvalidId(f"dedupe scope {scope!r}: use one of {', '.join(SCOPES)}")


def parsed_source(value: bytes) -> bytes:
    """The top-level ``sourceId`` of a JSON record, parsed; ``b""`` when it has none."""
    try:
        event = orjson.loads(value)
    except ValueError:  # orjson.JSONDecodeError, too deep, not UTF-8 ...
        return b""
    found = event.get(SOURCE_FIELD) if isinstance(event, dict) else None
    return found.encode() if isinstance(found, str) else b""


def record_sources(values: pa.Array | Sequence[bytes]) -> list[bytes]:
    """The source of each record value (module docstring), vectorised with Arrow.

    The collector's layout is read from the value's tail by one regular expression over the
    whole column; any other value is parsed (:func:`parsed_source`). The dedupe task and the
    rebuild from ``events`` both call this, so a record always gets the same source.
    """
    import pyarrow as pa
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    column = values if isinstance(values, pa.Array) else pa.array(values, pa.binary())
    found = pc.struct_field(pc.extract_regex(column, pattern=_SOURCE_TAIL), [0])
    tails: list[bytes] = found.to_pylist()
    if found.null_count == 0:
        return tails  # every value in the collector's layout (the usual case)
    return [
        tail if tail is not None else parsed_source(column[index].as_py() or b"")
        for index, tail in enumerate(tails)
    ]


def pack_owner(partition: int, offset: int) -> bytes:
    """The owner ``(partition, offset)`` as 8 bytes: 2-byte partition, 6-byte offset."""
    if not 0 <= partition <= MAX_PARTITION:
        raise InvalidId(f"an owner's partition is 0 to {MAX_PARTITION}, not {partition}")
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidId(f"an owner's offset is 0 to 2**48 - 1, not {offset}")
    return ((partition << 48) | offset).to_bytes(OWNER_BYTES, "big")


def pack_owners(partition: int, offsets: Sequence[int]) -> list[bytes]:
    """:func:`pack_owner` of many offsets of one ``partition``, packed together in numpy."""
    import numpy as np

    base = pack_owner(partition, 0)
    numbers = np.asarray(offsets, np.int64)
    if not numbers.size:
        return []
    low, high = int(numbers.min()), int(numbers.max())
    if low < 0 or high > MAX_OFFSET:
        wrong = low if low < 0 else high
        raise InvalidId(f"an owner's offset is 0 to 2**48 - 1, not {wrong}")
    owners = numbers.astype(np.uint64) | np.uint64(int.from_bytes(base, "big"))
    packed = owners.astype(">u8").tobytes()
    return [packed[at : at + OWNER_BYTES] for at in range(0, len(packed), OWNER_BYTES)]


def partition_prefix(partition: int) -> bytes:
    """The first :data:`PARTITION_BYTES` of every owner in ``partition``."""
    return pack_owner(partition, 0)[:PARTITION_BYTES]


def offset_bytes(offset: int) -> bytes:
    """The last :data:`OFFSET_BYTES` of an owner at ``offset``: ``partition_prefix(p) +
    offset_bytes(o) == pack_owner(p, o)``."""
    return pack_owner(0, offset)[PARTITION_BYTES:]


def owner_offset_bytes(owner: bytes) -> bytes:
    """The offset part of an owner (what a store of one partition keeps)."""
    return owner[PARTITION_BYTES:]


def owner_offset(owner: bytes) -> int:
    """The offset of an owner, unchecked (the store validated the owner on the way in)."""
    return int.from_bytes(owner[PARTITION_BYTES:], "big")


def unpack_owner(owner: bytes) -> tuple[int, int]:
    """``(partition, offset)`` back from :func:`pack_owner`'s 8 bytes."""
    if len(owner) != OWNER_BYTES:
        raise InvalidId(f"an owner is {OWNER_BYTES} bytes, not {len(owner)}")
    number = int.from_bytes(owner, "big")
    return number >> 48, number & MAX_OFFSET


def owner_text(owner: bytes) -> str:
    """An owner for people: ``partition:offset``."""
    partition, offset = unpack_owner(owner)
    return f"{partition}:{offset}"
