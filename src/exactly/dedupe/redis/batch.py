"""A claim call's ids as numpy arrays for the redis store: hashes, repeats, routing, payloads.

Per-id work in Python would cost more than Redis's own; so ids, owners and times are joined once
and every step after (hashing, finding repeats, picking shards and buckets, grouping, building
the commands) is vectorised.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np

from exactly.dedupe.base import Claim
from exactly.dedupe.redis.sharding import Epoch, Sharding, id_hashes
from exactly.dedupe.redis.transaction import Groups
from exactly.events.ids import ID_BYTES, MAX_OFFSET


class Batch:
    """A claim call's ids as arrays: hashes, times, offsets, repeats, and what goes where."""

    def __init__(self, claims: list[Claim], sharding: Sharding, window: int) -> None:
        count = len(claims)
        self.sharding = sharding
        self.ids = b"".join(map(itemgetter(0), claims))
        self.id_rows = np.frombuffer(self.ids, np.uint8).reshape(count, ID_BYTES)
        owners = b"".join(map(itemgetter(1), claims))
        offsets = np.frombuffer(owners, ">u8").astype(np.uint64) & np.uint64(MAX_OFFSET)
        self.offsets = offsets.astype(np.int64)
        self.times = np.fromiter(map(itemgetter(2), claims), np.int64, count)
        self.hashes = id_hashes(self.ids)
        self.newest = int(self.times.max())
        self.oldest = int(self.times.min()) - window
        self.latest = self.newest + sharding.current.slot_ms  # receive times are not quite ordered
        self.end = int(self.offsets.max()) + 1
        self.in_play = sharding.in_play(self.oldest)
        self.repeats = self._repeats(claims)
        unique = np.ones(count, bool)
        unique[list(self.repeats)] = False
        self.unique = np.flatnonzero(unique)

    def _repeats(self, claims: list[Claim]) -> dict[int, int]:
        """Later claims of an id already in the batch -> the index of its first claim."""
        ordered = np.sort(self.hashes)  # far quicker than argsort: most batches have no repeat
        if not (ordered[1:] == ordered[:-1]).any():
            return {}
        order = np.argsort(self.hashes, kind="stable")
        ordered = self.hashes[order]
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        if not same.size:
            return {}
        runs = np.unique(np.concatenate([same, same + 1]))
        first: dict[bytes, int] = {}
        repeats: dict[int, int] = {}
        for index in sorted(int(order[at]) for at in runs):
            claim_id = claims[index].id
            if claim_id in first:
                repeats[index] = first[claim_id]
            else:
                first[claim_id] = index
        return repeats

    def write_epoch(self, epoch: Epoch, chosen: Any) -> Any:
        """Mask of ``chosen`` claims that ``epoch`` stores (by receive time and cutover)."""
        cutover = self.sharding.cutover
        if cutover is None or self.sharding.previous is None:
            return np.ones(len(chosen), bool)
        before = self.times[chosen] < cutover
        return before if epoch is self.sharding.previous else ~before

    def route(self, epoch: Epoch, chosen: Any) -> list[tuple[str, Any]]:
        """``chosen`` claim indices per server of ``epoch``; every server, even without claims."""
        shard = (self.hashes[chosen] >> np.uint64(32)) % np.uint64(len(epoch.shards))
        return [(url, chosen[shard == k]) for k, url in enumerate(epoch.shards)]

    def payload(self, epoch: Epoch, chosen: Any) -> tuple[Any, Groups]:
        """``chosen`` in call order (by slot, then bucket) and its groups, one per bucket."""
        bucket = (self.hashes[chosen] & np.uint64(0xFFFFFFFF)) % np.uint64(epoch.buckets)
        slot = self.times[chosen] // epoch.slot_ms
        first = int(slot.min()) if len(slot) else 0
        key = (slot - first).astype(np.uint64) * np.uint64(epoch.buckets) + bucket
        order = np.argsort(key)  # ids are unique: their order within a bucket does not matter
        chosen, key = chosen[order], key[order]
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if len(key) else key
        return chosen, Groups(
            slot[order][starts],
            bucket[order][starts].astype(np.int64),
            np.append(starts[1:], len(chosen)).astype(np.int64),
            np.minimum.reduceat(self.times[chosen], starts) if len(key) else key,
        )
