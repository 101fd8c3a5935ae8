"""The dedupe stores the contract suite runs on, built from a name and a place; and a claimer.

Run as ``python -m tests.dedupe_stores STORE WHERE PARTITION``: claims batches of new ids and
prints the highest offset of each batch once :meth:`claim` returned (so a parent can SIGKILL it
and check that every acknowledged claim survived).
"""

from __future__ import annotations

import sys
from pathlib import Path

from exactly.dedupe.base import Claim, DedupeStore
from exactly.dedupe.window import Bounds
from exactly.events.ids import pack_id, pack_owner

STORES = ["rocksdb", "redis"]


def make_store(name: str, where: str, bounds: Bounds | None = None) -> DedupeStore:
    """The store ``name`` keeping its data at ``where``: a directory, or for redis
    ``URL[,URL...] NAMESPACE`` (its shards and key prefix)."""
    if name == "rocksdb":
        from exactly.dedupe.rocksdb import RocksDBStore

        return RocksDBStore(Path(where), bounds, lock_timeout=30)
    if name == "redis":
        from exactly.dedupe.redis import RedisStore
        from exactly.dedupe.sharding import sharding_from

        urls, namespace = where.split(" ")
        # a short lock TTL: a SIGKILLed claimer's lock lapses quickly
        return RedisStore(sharding_from(urls), namespace, bounds, lock_ttl=2, lock_timeout=30)
    raise ValueError(f"no store {name!r} in the contract suite")


def message_id(offset: int) -> str:
    return f"m-{offset}"


def claim_forever(name: str, where: str, partition: int) -> None:
    store = make_store(name, where)
    with store.open(partition) as part:
        offset = part.position() or 0
        print("ready", flush=True)
        while True:
            claims = [
                Claim(pack_id(message_id(o)), pack_owner(partition, o), 1_000 + o)
                for o in range(offset, offset + 200)
            ]
            part.claim(claims)
            offset += len(claims)
            print(offset - 1, flush=True)


if __name__ == "__main__":
    claim_forever(sys.argv[1], sys.argv[2], int(sys.argv[3]))
