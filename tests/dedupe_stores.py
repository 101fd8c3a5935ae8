"""The dedupe stores the contract suite runs on (``exactly.dedupe.BACKENDS``); and a claimer.

Run as ``python -m tests.dedupe_stores STORE WHERE PARTITION``: claims batches of new ids and
prints the highest offset of each batch once :meth:`claim` returned (so a parent can SIGKILL it
and check that every acknowledged claim survived).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from exactly.dedupe import BACKENDS, open_store
from exactly.dedupe.base import Claim, DedupeStore
from exactly.dedupe.window import Bounds
from exactly.events.ids import pack_id, pack_owner


def make_store(name: str, where: str, bounds: Bounds | None = None) -> DedupeStore:
    """The store ``name`` (one of ``exactly.dedupe.BACKENDS``) keeping its data at ``where``: a
    directory, or for redis ``URL[,URL...] NAMESPACE`` (its shards and key prefix). Opened by URL,
    as the job opens it."""
    if name == "rocksdb":
        return open_store(f"rocksdb://{where}", bounds, lock_timeout=30)
    if name == "redis":
        urls, namespace = where.split(" ")
        # a short lock TTL: a SIGKILLed claimer's lock lapses quickly
        url = redis_store_url(urls.split(","), namespace)
        return open_store(url, bounds, lock_ttl=2, lock_timeout=30)
    raise AssertionError(f"no test store for the dedupe backend {name!r}: add one here")


def redis_store_url(urls: Sequence[str], namespace: str, **options: object) -> str:
    """The redis store URL sharding over the servers ``urls`` (``redis://HOST:PORT/DB`` each)."""
    query = "".join(f"&{name}={value}" for name, value in options.items())
    return f"redis://{hosts(urls)}/0?namespace={namespace}{query}"


def hosts(urls: Sequence[str]) -> str:
    """``HOST:PORT,HOST:PORT`` of server URLs, as a redis store URL lists them."""
    return ",".join(url.removeprefix("redis://").split("/")[0] for url in urls)


# The claim-store contract runs on every store; spark-state is no store but the job's other
# mode, Spark's operator deciding (tested through the job, tests/integration/test_dedupe_job.py).
STORES = list(BACKENDS)


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
