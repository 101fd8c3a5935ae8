"""Pure policy for many directors: which partition a bucket is in, how many partitions a
director keeps, and its part of a destination's limits.

The JobDB's buckets (source × destination) are spread over ``[delivery] partitions``; each
director holds a lease on some partitions and delivers only their buckets
(:mod:`exactly.delivery.leases`). Everything here is a function of its arguments, so every
director computes the same answers without talking to the others.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Collection, Iterable

from exactly.delivery.jobdb.base import split_bucket


@functools.lru_cache(maxsize=65_536)  # asked before every request a director sends
def partition_of(bucket: str, partitions: int) -> int:
    """The partition of ``bucket``: the first 8 bytes of its lane-0 name's SHA-256 plus its
    lane, modulo ``partitions``, so a destination's lanes sit on consecutive partitions and
    ``partitions`` directors or fewer each get an even part of them.

    Stable across processes, hosts and Python versions (``hash()`` is salted per process), so
    every director and operator agrees on it.
    """
    if partitions <= 1:
        return 0
    name, lane = split_bucket(bucket)
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return (int.from_bytes(digest[:8], "big") + lane) % partitions


def fair_share(partitions: int, directors: int) -> int:
    """The most partitions one of ``directors`` live directors keeps: ``ceil(P / N)``.

    A director takes free partitions up to this and releases those above it, so a director
    that starts later finds some free once the others have shed their extras.
    """
    return max(1, math.ceil(partitions / max(1, directors)))


def to_release(held: Collection[int], share: int, keep: int | None = 0) -> list[int]:
    """Which of ``held`` to release to come down to ``share``: the highest numbers first,
    never ``keep`` (partition 0, whose holder does the JobDB's upkeep, stays put)."""
    extra = len(held) - share
    if extra <= 0:
        return []
    order = sorted((p for p in held if p != keep), reverse=True)
    return order[:extra]


def probe_order(partitions: int, start: int) -> list[int]:
    """Every partition once, from ``start`` on, wrapping: directors starting from different
    places do not all contend for partition 0 first."""
    return [(start + i) % partitions for i in range(partitions)]


def portion(total: int, mine: Collection[int], spread: Iterable[int]) -> int:
    """This director's part of an integer limit (``max_in_flight``, ``burst``) of a destination
    whose buckets are in partitions ``spread``, when it holds partitions ``mine``.

    The limit is apportioned over the destination's partitions in order (partition ``i`` of
    ``n`` gets ``floor(total·(i+1)/n) - floor(total·i/n)``), and a director gets the sum for the
    ones it holds, at least 1: the portions add up to ``total`` when it is at least the number of
    partitions, else they may pass it by at most the directors sharing it but one. Without any
    spread it is ``total``.
    """
    order = sorted(set(spread))
    if not order:
        return total
    n = len(order)
    share = sum((total * (i + 1)) // n - (total * i) // n for i, p in enumerate(order) if p in mine)
    return max(1, share)


def rate_portion(rate: float | None, mine: Collection[int], spread: Iterable[int]) -> float | None:
    """This director's part of a destination's ``rate``: ``rate × held / all`` of the
    partitions holding the destination's buckets (the whole rate without any)."""
    if rate is None:
        return None
    order = set(spread)
    if not order:
        return rate
    held = len(order & set(mine))
    return rate * held / len(order) if held else rate / len(order)
