"""One partition of the redis store: its lease, its servers' positions, the claim protocol.

The commit protocol of :meth:`RedisPartition._claim` is numbered in the package's docstring
(``exactly.dedupe.redis``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from exactly.dedupe.base import Claim, PartitionStats, StorePartition
from exactly.dedupe.redis.batch import Batch
from exactly.dedupe.redis.client import (
    connect,
    evalsha,
    guarded,
    listpack_entries,
    listpack_limit,
    parallel,
    warn_once,
)
from exactly.dedupe.redis.lease import Lease
from exactly.dedupe.redis.sharding import Epoch, Sharding, lookup_slots, partition_position
from exactly.errors import StoreUnavailable
from exactly.events.ids import offset_bytes

CHUNK = 100_000  # ids per script call: keeps a call well under Redis's busy-script limit (5 s)


class Store(Protocol):
    """What a partition needs of its :class:`~exactly.dedupe.redis.store.RedisStore`."""

    sharding: Sharding
    timeout: float
    lock_ttl: float
    lock_timeout: float

    @property
    def window(self) -> int: ...

    def prefix(self, partition: int) -> str: ...

    def _read_stats(self, partition: int) -> PartitionStats: ...


class RedisPartition(StorePartition):
    """One partition of a :class:`RedisStore`, locked until :meth:`close`."""

    def __init__(self, store: Store, partition: int) -> None:
        super().__init__(partition)
        self.store = store
        self.sharding = store.sharding
        self.prefix = store.prefix(partition)
        lock_url = self.sharding.current.shards[0]
        for url in self.sharding.servers:
            listpack_entries(url, connect(url, store.timeout))
        self._lease: Lease | None = Lease(
            lock_url, connect(lock_url, store.timeout), self.prefix + "lock", store.lock_ttl
        )
        self._lease.acquire(store.lock_timeout)
        try:
            self._positions: dict[str, int | None] = {}
            self._newest: int | None = None
            for url in self.sharding.servers:
                client = connect(url, store.timeout)
                with guarded(url):
                    position, newest = client.hmget(self.prefix + "meta", "position", "newest")
                self._positions[url] = None if position is None else int(position)
                if newest is not None:
                    self._newest = max(self._newest or int(newest), int(newest))
        except BaseException:
            self._close()
            raise

    def _position(self) -> int | None:
        return partition_position(self.sharding, self._positions, self._newest, self.store.window)

    def _stats(self) -> PartitionStats:
        return self.store._read_stats(self.partition)

    def _close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def _claim(self, claims: list[Claim], *, restoring: bool) -> list[bytes | None]:
        if self._lease is None:
            raise StoreUnavailable(f"partition {self.partition} of the store was closed")
        batch = Batch(claims, self.sharding, self.store.window)
        counted_from = self._position() or 0
        owners: list[bytes | None] = [None] * len(claims)
        # 1. repeats within the batch wait for their first claim (below)
        # 2. the other epoch, read-only, while resharding
        decided = self._other_epoch(batch)
        for index, offset in decided.items():
            owners[index] = self._prefix + offset_bytes(offset)
        # 3. claim on every server in play, in parallel
        mode = "restore" if restoring else "claim"
        extra_claimed = extra_dups = 0
        if not restoring:
            for index in [*decided, *batch.repeats]:
                if batch.offsets[index] >= counted_from:
                    extra_claimed += 1
                    extra_dups += index in batch.repeats or owners[index] != claims[index].owner
        calls: dict[str, list[tuple[Epoch, Any]]] = {}
        undecided = batch.unique[~np.isin(batch.unique, list(decided))] if decided else batch.unique
        for epoch in batch.in_play:
            writers = undecided[batch.write_epoch(epoch, undecided)]
            for url, chosen in batch.route(epoch, writers):
                calls.setdefault(url, []).append((epoch, chosen))
        first_url = next(iter(calls))
        extras = {first_url: (extra_claimed, extra_dups)}

        def run(url: str) -> list[tuple[int, int]]:
            found: list[tuple[int, int]] = []
            for epoch, chosen in calls[url]:
                found += self._call(
                    url, mode, batch, epoch, chosen, counted_from, extras.pop(url, (0, 0))
                )
            return found

        for found in parallel(run, list(calls)):
            for index, offset in found:
                owners[index] = self._prefix + offset_bytes(offset)
        self._newest = max(self._newest or batch.newest, batch.newest)
        for index, first in batch.repeats.items():
            owners[index] = owners[first] or claims[first].owner
        return owners

    def _other_epoch(self, batch: Batch) -> dict[int, int]:
        """Step 2: ids found in the epoch that does not place them; index -> owner offset."""
        if len(batch.in_play) < 2:
            return {}
        work: list[tuple[str, Epoch, Any]] = []
        for epoch in batch.in_play:
            readers = batch.unique[~batch.write_epoch(epoch, batch.unique)]
            work += [(url, epoch, chosen) for url, chosen in batch.route(epoch, readers)]
        decided: dict[int, int] = {}
        for found in parallel(
            lambda item: self._call(item[0], "lookup", batch, item[1], item[2], 0, (0, 0)), work
        ):
            decided.update(found)
        return decided

    def _call(
        self,
        url: str,
        mode: str,
        batch: Batch,
        epoch: Epoch,
        chosen: Any,
        counted_from: int,
        extra: tuple[int, int],
    ) -> list[tuple[int, int]]:
        """The script on one server for ``chosen`` claims (indices), in chunks of :data:`CHUNK`."""
        client = connect(url, self.store.timeout)
        lease = self._lease
        assert lease is not None
        slots = lookup_slots(self.sharding, epoch, batch.oldest, batch.latest)
        low, high = (slots.start, slots.stop - 1) if slots else (0, -1)
        writing = mode != "lookup"
        found: list[tuple[int, int]] = []
        chunks = [chosen[at : at + CHUNK] for at in range(0, len(chosen), CHUNK)] or [chosen]
        for number, part in enumerate(chunks):
            last = number == len(chunks) - 1
            expected = self._positions[url]
            args = [
                self.prefix,
                mode,
                -1 if expected is None else expected,
                batch.end if last and writing else -1,
                counted_from,
                batch.newest,
                low,
                high,
                epoch.slot_ms,
                self.store.window,
                int(np.count_nonzero(batch.offsets[part] >= counted_from)),
                *(extra if last else (0, 0)),
                *((lease.key, lease.token) if url == lease.url and writing else ("", "")),
            ]
            ordered, *blobs = batch.payload(epoch, part, low)
            args += blobs
            with guarded(url):
                reply = evalsha(client, args)
            if writing:
                position = int(reply[0])
                self._positions[url] = None if position < 0 else position
            if reply[1] > listpack_limit(url):
                warn_once(url, int(reply[1]))
            for at in range(2, len(reply), 2):
                found.append((int(ordered[reply[at] - 1]), int(reply[at + 1])))
        return found
