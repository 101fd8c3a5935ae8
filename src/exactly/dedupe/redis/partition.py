"""One partition of the redis store: its lease, its servers' positions, the claim protocol.

The commit protocol of :meth:`RedisPartition._claim` is numbered in the package's docstring
(``exactly.dedupe.redis``).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from exactly.dedupe.base import Claim, PartitionStats, StorePartition
from exactly.dedupe.redis import transaction
from exactly.dedupe.redis.batch import Batch
from exactly.dedupe.redis.client import (
    connect,
    guarded,
    listpack_entries,
    listpack_limit,
    parallel,
    warn_once,
)
from exactly.dedupe.redis.lease import Lease
from exactly.dedupe.redis.sharding import Epoch, Sharding, lookup_slots, partition_position
from exactly.dedupe.redis.transaction import ServerCall
from exactly.errors import StoreUnavailable
from exactly.events.ids import offset_bytes

CHUNK = 1_000_000  # ids per transaction; an EXEC of that many takes Redis about 0.5 s, others wait


class Store(Protocol):
    """What a partition needs of its :class:`~exactly.dedupe.redis.store.RedisStore`."""

    sharding: Sharding
    timeout: float
    lock_ttl: float
    lock_timeout: float
    scope: str | None

    @property
    def scope_key(self) -> str: ...

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
        """One server's share for ``chosen`` claims (indices), in chunks of :data:`CHUNK`."""
        client = connect(url, self.store.timeout)
        lease = self._lease
        assert lease is not None
        writing = mode != "lookup"
        lock = (lease.key, lease.token) if url == lease.url and writing else None
        found: list[tuple[int, int]] = []
        chunks = [chosen[at : at + CHUNK] for at in range(0, len(chosen), CHUNK)] or [chosen]
        for number, part in enumerate(chunks):
            last = number == len(chunks) - 1
            ordered, groups = batch.payload(epoch, part)
            call = ServerCall(
                self.prefix,
                mode,
                epoch,
                expected=self._positions[url],
                finish=batch.end if last and writing else None,
                counted_from=counted_from,
                newest=batch.newest,
                lookup=lookup_slots(self.sharding, epoch, batch.oldest, batch.latest),
                window=self.store.window,
                fresh=int(np.count_nonzero(batch.offsets[part] >= counted_from)),
                extra=extra if last else (0, 0),
                lock=lock,
                scope=(self.store.scope_key, self.store.scope) if self.store.scope else None,
            )
            with guarded(url):
                reply = transaction.run(
                    client, call, batch.id_rows[ordered], batch.offsets[ordered], groups
                )
            if writing:
                self._positions[url] = reply.position
            if reply.largest > listpack_limit(url):
                warn_once(url, reply.largest)
            found += [(int(ordered[index]), offset) for index, offset in reply.found]
        return found
