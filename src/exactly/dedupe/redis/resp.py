"""Redis commands in RESP, built from arrays: the ids of a claim call without a Python loop per id.

redis-py packs a command argument by argument in Python, which for a million ids costs more than
Redis's own work on them. Ids are 16 bytes each, so each id's bulk string is a fixed-size row of
one numpy array; an offset's decimal digits are written a digit column at a time. Only the
per-bucket command headers are built one by one (a bucket holds tens to hundreds of ids).

Offsets go as decimal text, as ``HSET`` gets them from any client: Redis stores such a value as an
integer (3 to 6 bytes in a listpack).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactly.events.ids import ID_BYTES

CRLF = b"\r\n"
_ID_HEAD = b"$%d\r\n" % ID_BYTES
ID_ARG = len(_ID_HEAD) + ID_BYTES + len(CRLF)  # one id as a bulk string: 23 bytes


def command(*args: bytes | str | int) -> bytes:
    """One command of a few arguments (keys, counters) in RESP."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out += (b"$%d\r\n" % len(data), data, CRLF)
    return b"".join(out)


def id_args(rows: Any) -> Any:
    """Each 16-byte id (a row of ``rows``, uint8) as a bulk string: an (n, 23) uint8 array."""
    out = np.empty((len(rows), ID_ARG), np.uint8)
    out[:, : len(_ID_HEAD)] = np.frombuffer(_ID_HEAD, np.uint8)
    out[:, len(_ID_HEAD) : len(_ID_HEAD) + ID_BYTES] = rows
    out[:, -len(CRLF) :] = np.frombuffer(CRLF, np.uint8)
    return out


def digit_counts(values: Any) -> Any:
    """How many decimal digits each value (non-negative int64) has."""
    counts = np.ones(len(values), np.int64)
    for power in range(1, 19):
        counts += values >= 10**power
    return counts


def pair_args(rows: Any, values: Any) -> tuple[Any, Any]:
    """``id value`` argument pairs for ``HSET``, id *i* with value *i* in decimal.

    Returns the concatenated bytes (uint8) and the end of each pair in them. Each pair is built
    as a row padded to the longest, then the padding is masked out (rows stay in order).
    """
    digits = digit_counts(values)
    lengths = ID_ARG + 4 + (digits >= 10) + digits + len(CRLF)  # "$7\r\n" or "$12\r\n"
    widest = int(lengths.max(initial=0))
    table = np.zeros((len(rows), widest), np.uint8)
    table[:, :ID_ARG] = id_args(rows)
    widths = np.unique(digits).tolist()
    for width in widths:
        chosen = slice(None) if len(widths) == 1 else digits == width
        head = b"$%d\r\n" % width
        begin = ID_ARG + len(head)
        number = values[chosen]
        text = np.empty((len(number), len(head) + width + len(CRLF)), np.uint8)
        text[:, : len(head)] = np.frombuffer(head, np.uint8)
        for place in range(width):
            text[:, len(head) + width - 1 - place] = 48 + (number // 10**place) % 10
        text[:, -len(CRLF) :] = np.frombuffer(CRLF, np.uint8)
        table[chosen, ID_ARG : begin + width + len(CRLF)] = text
    if (lengths == widest).all():
        return table.reshape(-1), np.cumsum(lengths)
    return table[np.arange(widest) < lengths[:, None]], np.cumsum(lengths)


def grouped(
    name: bytes, keys: Sequence[bytes], args: Any, ends: Any, group_ends: Sequence[int], per: int
) -> list[bytes | memoryview]:
    """``NAME key arg...`` per group, each group's arguments a slice of ``args`` (uint8).

    ``ends[i]`` ends argument unit *i* (an id, or an id-value pair of ``per`` arguments);
    ``group_ends[g]`` is the number of units up to the end of group *g*. Returns the parts of the
    commands, to be joined or sent as they are.
    """
    view = np.ascontiguousarray(args).reshape(-1).data
    head = b"$%d\r\n%s\r\n" % (len(name), name)
    parts: list[bytes | memoryview] = []
    begin = 0
    for key, end in zip(keys, group_ends, strict=True):
        parts.append(b"*%d\r\n%s$%d\r\n%s\r\n" % (2 + per * (end - begin), head, len(key), key))
        parts.append(view[(int(ends[begin - 1]) if begin else 0) : int(ends[end - 1])])
        begin = end
    return parts
