"""A batch made by the route query: one JobDB job carrying its members (pure functions).

For a batching destination (``batch.max_events`` above 1) that is not ``ordered``, the route
query cuts each micro-batch's events for it, per bucket, into batches (:func:`exactly.delivery.
batches.cut`) and adds each as **one job**: one row to insert, page in, send and record, however
many events it carries, where a row per event was the bound of the whole delivery path
(docs/pace.md). A micro-batch's batches are fixed when it is routed, and a replayed micro-batch
adds nothing (the JobDB's marker), so the batch, its key and its body are the same on every
attempt and after any crash.

A packed job's columns:

* ``payload``: :func:`pack` of its members, below; JSON never starts with a NUL byte, so
  :func:`is_packed` tells a pack from an event's payload by its first byte;
* ``message_id``: its key (:func:`pack_key`), the ``Idempotency-Key`` / ``webhook-id`` of every
  attempt;
* ``user_id``: none (a pack is never ordered);
* ``events``: how many members it has, so counts stay in events; its id is the first of as many
  ids as it has members, so a dataset fills by events too.

Layout: ``MAGIC``, the member count, then per member the lengths of its message id, user id (+1,
0 for none) and payload (little-endian uint32), then the ids, then the payloads joined by ``,``
(a ``json-array`` body is that between brackets, with no copy per member).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from exactly.delivery.settings import DestinationSettings

MAGIC = b"\x00xp1"
_COUNT = struct.Struct("<I")
_START = len(MAGIC) + _COUNT.size


class Member(NamedTuple):
    """One event of a pack, as a job alone would hold it."""

    message_id: str
    user_id: str | None
    payload: bytes


def packing(destination: DestinationSettings) -> bool:
    """Whether the route query sends ``destination`` its events as packs: a batching
    destination that is not ordered (an ordered one holds a user's later events while an
    earlier one is out, so its director forms its batches)."""
    return destination.batching and not destination.ordered


def is_packed(payload: bytes) -> bool:
    """Whether ``payload`` is a pack (an event's JSON never starts with NUL)."""
    return payload[:4] == MAGIC


def pack(members: Sequence[Member]) -> bytes:
    """The payload of a job carrying ``members``, in their order."""
    return pack_columns(
        [member.message_id for member in members],
        [member.user_id for member in members],
        [member.payload for member in members],
    )


def pack_columns(
    message_ids: Sequence[str], user_ids: Sequence[str | None], payloads: Sequence[bytes]
) -> bytes:
    """:func:`pack` of the members given as three columns (the route query's, with no object
    made per member)."""
    count = len(payloads)
    if not count:
        raise ValueError("a pack needs at least one member")
    mids = [message_id.encode() for message_id in message_ids]
    uids = [b"" if user_id is None else user_id.encode() for user_id in user_ids]
    uid_lengths = [
        0 if user_id is None else len(uid) + 1 for user_id, uid in zip(user_ids, uids, strict=True)
    ]
    lengths = chain.from_iterable(zip(map(len, mids), uid_lengths, map(len, payloads), strict=True))
    table = struct.pack(f"<{3 * count}I", *lengths)
    ids = b"".join(chain.from_iterable(zip(mids, uids, strict=True)))
    return b"".join((MAGIC, _COUNT.pack(count), table, ids, b",".join(payloads)))


def count(payload: bytes) -> int:
    """How many events ``payload`` carries: a pack's members, else one."""
    if not is_packed(payload):
        return 1
    return int(_COUNT.unpack_from(payload, len(MAGIC))[0])


def _layout(payload: bytes) -> tuple[int, tuple[int, ...], int]:
    """A pack's member count, its lengths table and where its ids start."""
    n = count(payload)
    lengths = struct.unpack_from(f"<{3 * n}I", payload, _START)
    return n, lengths, _START + 12 * n


def joined(payload: bytes) -> bytes:
    """A pack's payloads joined by ``,``, as stored (a ``json-array`` body without brackets)."""
    n, lengths, at = _layout(payload)
    ids = sum(lengths[i] + max(lengths[i + 1] - 1, 0) for i in range(0, 3 * n, 3))
    return payload[at + ids :]


def members(payload: bytes) -> list[Member]:
    """A pack's members, in order."""
    n, lengths, at = _layout(payload)
    view = memoryview(payload)
    heads: list[tuple[str, str | None]] = []
    for i in range(0, 3 * n, 3):
        mid_length, uid_length = lengths[i], lengths[i + 1]
        mid = bytes(view[at : at + mid_length]).decode()
        at += mid_length
        uid = None
        if uid_length:
            uid = bytes(view[at : at + uid_length - 1]).decode()
            at += uid_length - 1
        heads.append((mid, uid))
    found: list[Member] = []
    for (mid, uid), i in zip(heads, range(0, 3 * n, 3), strict=True):
        size = lengths[i + 2]
        found.append(Member(mid, uid, bytes(view[at : at + size])))
        at += size + 1  # the ","
    return found


def payloads(payload: bytes) -> list[bytes]:
    """A pack's members' payloads, in order (the body of any batch format)."""
    return [member.payload for member in members(payload)]


def message_ids(payload: bytes) -> list[str]:
    return [member.message_id for member in members(payload)]


def pack_key(destination: str, ids: Iterable[str]) -> str:
    """The key of a pack of ``destination`` whose members have these message ids, in order.

    Only a replay of the same micro-batch routes the same events again, and the JobDB's marker
    adds nothing then, so a key names one pack."""
    digest = hashlib.sha256(b"pack\n" + destination.encode())
    listed = list(ids)
    if listed:  # each id after a newline: one join, not an update per id
        digest.update(b"\n" + "\n".join(listed).encode())
    return "pack_" + digest.hexdigest()[:32]


def trim(payload: bytes, drop: Callable[[Member], bool]) -> tuple[bytes | None, int]:
    """``payload`` without the members ``drop`` picks, and how many it picked: the same bytes
    when none, ``None`` when every member goes (``exactly forget``)."""
    found = members(payload)
    kept = [member for member in found if not drop(member)]
    if len(kept) == len(found):
        return payload, 0
    return (pack(kept) if kept else None), len(found) - len(kept)
