"""The redis store's commands built from arrays are byte for byte what redis-py would send."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import Connection

from exactly.dedupe.redis.resp import ID_ARG, command, grouped, id_args, pair_args
from exactly.events.ids import MAX_OFFSET

PACKER = Connection()


def packed(*args: bytes | str | int) -> bytes:
    return b"".join(PACKER.pack_command(*args))


ids = st.binary(min_size=16, max_size=16)
offsets = st.integers(min_value=0, max_value=MAX_OFFSET)


@given(st.lists(st.tuples(ids, offsets), min_size=1, max_size=40), st.data())
def test_hmget_and_hset_per_bucket_match_redis_py(
    claims: list[tuple[bytes, int]], data: st.DataObject
) -> None:
    cuts = data.draw(st.sets(st.integers(1, len(claims) - 1))) if len(claims) > 1 else set()
    ends = [*sorted(cuts), len(claims)]
    keys = [b"ns:0:7:%d" % n for n in range(len(ends))]
    rows = np.frombuffer(b"".join(c[0] for c in claims), np.uint8).reshape(-1, 16)
    values = np.array([c[1] for c in claims], np.int64)
    bounds = list(zip([0, *ends[:-1]], ends, strict=True))

    got = b"".join(
        grouped(b"HMGET", keys, id_args(rows), np.arange(1, len(rows) + 1) * ID_ARG, ends, 1)
    )
    want = b"".join(
        packed("HMGET", key, *(c[0] for c in claims[a:b]))
        for key, (a, b) in zip(keys, bounds, strict=True)
    )
    assert got == want

    args, pair_ends = pair_args(rows, values)
    got = b"".join(grouped(b"HSET", keys, args, pair_ends, ends, 2))
    want = b"".join(
        packed("HSET", key, *(part for c in claims[a:b] for part in c))
        for key, (a, b) in zip(keys, bounds, strict=True)
    )
    assert got == want


def test_a_small_command_matches_redis_py() -> None:
    assert command("PEXPIRE", b"ns:0:7:3", 86_400_000) == packed("PEXPIRE", b"ns:0:7:3", 86400000)
    assert command("HINCRBY", "ns:0:meta", "n:7", 12) == packed("HINCRBY", "ns:0:meta", "n:7", 12)
