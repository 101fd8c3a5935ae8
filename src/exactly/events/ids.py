"""Id and owner packing for the dedupe stores (DESIGN.md "Deduplication"): pure functions.

A dedupe store keeps ``messageId -> owner`` for millions of ids, so both sides are packed small:

* **Ids to 16 bytes.** A UUID, with or without dashes, in either case, and Segment's browser form
  ``ajs-`` + 32 hex digits, are stored as their 16 bytes. Any other string is stored as its
  128-bit BLAKE2b digest (a collision needs about 2**64 ids, far beyond any window). The one
  consequence to know: the same UUID written two ways (dashed and plain, upper and lower case,
  with ``ajs-``) packs to the same id. Such spellings are different strings, so the partitioner
  usually puts them in different partitions, and a store only ever compares ids of one partition.
* **Owners to 8 bytes.** The owner of an id is the raw record that claimed it first: a 2-byte
  partition and a 6-byte offset, big-endian (Tapjoy's layout). 2**48 offsets per partition is
  beyond any log's life, so the offset never wraps in practice.

Everything here is pure and deterministic across processes and machines.
"""

from __future__ import annotations

import binascii
import hashlib

from exactly.errors import InvalidId

ID_BYTES = 16
OWNER_BYTES = 8
MAX_PARTITION = 0xFFFF
MAX_OFFSET = (1 << 48) - 1

_DASHES = (8, 13, 18, 23)


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


def pack_owner(partition: int, offset: int) -> bytes:
    """The owner ``(partition, offset)`` as 8 bytes: 2-byte partition, 6-byte offset."""
    if not 0 <= partition <= MAX_PARTITION:
        raise InvalidId(f"an owner's partition is 0 to {MAX_PARTITION}, not {partition}")
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidId(f"an owner's offset is 0 to 2**48 - 1, not {offset}")
    return ((partition << 48) | offset).to_bytes(OWNER_BYTES, "big")


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
