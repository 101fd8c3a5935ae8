"""The redis dedupe store against Tapjoy's naive pipeline, and memory per id.

    .venv/bin/python bench/dedupe_redis.py [--ids 2000000] [--rounds 3] [--buckets 32768]

(a) **Speed**: a batch of ``--ids`` new UUID messageIds (one partition, receive times within one
slot) claimed (1) through the store, ``RedisPartition.claim``: the client's hashing and
grouping, then per shard and chunk one watched read and one ``MULTI``/``EXEC``
(``transaction.py``), shards in parallel threads, verdicts built; and (2) the naive way Tapjoy
started from: pipelined ``HSETNX bucket id owner`` + ``HGET bucket id`` per id, in the same
buckets, on the same shards in parallel threads, the verdicts decided from the replies. Each on
1 server (the local Redis) and on 3 (it and two ``redis-server`` processes started on free
ports), interleaved (store, naive, store 3, naive 3) in each round, each run under a fresh
namespace deleted afterwards; medians and their ratios.
Put an older ``src`` first on ``PYTHONPATH`` to measure an earlier store the same way.

(b) **Memory**: ``used_memory`` of the local server after the store's run minus before, per id.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisServer

from exactly.dedupe.base import Claim
from exactly.dedupe.redis import RedisStore
from exactly.dedupe.redis.sharding import Epoch, Sharding, bucket_of, id_hash, shard_of
from exactly.dedupe.window import Bounds
from exactly.events.ids import pack_owner

LOCAL = "redis://127.0.0.1:6379/0"
HOUR = 3_600_000
START = 1_795_300_000_000
PIPELINE = 50_000  # ids per pipeline round trip


def batch(count: int) -> list[Claim]:
    return [
        Claim(uuid.uuid4().bytes, pack_owner(0, offset), START + offset // 1000)
        for offset in range(count)
    ]


def drop(urls: list[str], namespace: str) -> None:
    for url in urls:
        client = redis.Redis.from_url(url)
        keys = list(client.scan_iter(f"{namespace}:*", count=10_000))
        for at in range(0, len(keys), 10_000):
            client.unlink(*keys[at : at + 10_000])


def store_run(urls: list[str], claims: list[Claim], buckets: int) -> tuple[float, float]:
    """Seconds to claim through the store, and used_memory growth of the first server per id."""
    namespace = f"bench:{uuid.uuid4().hex[:8]}"
    store = RedisStore(Sharding(Epoch(tuple(urls), buckets)), namespace, Bounds(window=HOUR))
    local = redis.Redis.from_url(urls[0])
    before = local.info("memory")["used_memory"]
    with store.open(0) as part:
        began = time.perf_counter()
        verdicts = part.claim(claims)
        seconds = time.perf_counter() - began
    assert all(v.passes for v in verdicts)
    per_id = (local.info("memory")["used_memory"] - before) / (len(claims) / len(urls))
    drop(urls, namespace)
    return seconds, per_id


def naive(urls: list[str], claims: list[Claim], buckets: int) -> float:
    """Seconds for pipelined HSETNX + HGET per id, shards in parallel, verdicts decided."""
    namespace = f"bench:{uuid.uuid4().hex[:8]}"
    per_shard: list[list[tuple[str, bytes, bytes]]] = [[] for _ in urls]
    began = time.perf_counter()
    for claim in claims:
        hashed = id_hash(claim.id)
        key = f"{namespace}:0:{claim.time // (3 * HOUR)}:{bucket_of(hashed, buckets)}"
        per_shard[shard_of(hashed, len(urls))].append((key, claim.id, claim.owner[2:]))

    def send(shard: int) -> int:
        client = redis.Redis.from_url(urls[shard])
        passed = 0
        work = per_shard[shard]
        for at in range(0, len(work), PIPELINE):
            pipe = client.pipeline(transaction=False)
            for key, claim_id, owner in work[at : at + PIPELINE]:
                pipe.hsetnx(key, claim_id, owner)
                pipe.hget(key, claim_id)
            replies = pipe.execute()
            for n, (_, _, owner) in enumerate(work[at : at + PIPELINE]):
                passed += replies[2 * n + 1] == owner
        return passed

    with ThreadPoolExecutor(len(urls)) as pool:
        passed = sum(pool.map(send, range(len(urls))))
    seconds = time.perf_counter() - began
    assert passed == len(claims)
    drop(urls, namespace)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--buckets", type=int, default=32768, help="per slot (about 60 of 2M ids each)"
    )
    args = parser.parse_args()
    version = redis.Redis.from_url(LOCAL).info("server")["redis_version"]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Redis {version}")
    times: dict[str, list[float]] = {"store 1": [], "naive 1": [], "store 3": [], "naive 3": []}
    memory: list[float] = []
    with RedisServer() as second, RedisServer() as third:
        shards = {"1": [LOCAL], "3": [LOCAL, second.url, third.url]}
        for round_ in range(args.rounds):
            for count in ("1", "3"):
                claims = batch(args.ids)
                seconds, per_id = store_run(shards[count], claims, args.buckets)
                times[f"store {count}"].append(seconds)
                if count == "1":
                    memory.append(per_id)
                times[f"naive {count}"].append(naive(shards[count], claims, args.buckets))
            print(
                f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
            )
    print(f"\n{args.ids:,} new ids per batch, {args.buckets} buckets, {args.rounds} rounds\n")
    print("| servers | the store: s (ids/s) | naive pipeline: s (ids/s) | store / naive speed |")
    print("| --- | --- | --- | --- |")
    for count in ("1", "3"):
        fast = statistics.median(times[f"store {count}"])
        slow = statistics.median(times[f"naive {count}"])
        print(
            f"| {count} | {fast:.2f} ({args.ids / fast:,.0f}) | {slow:.2f} "
            f"({args.ids / slow:,.0f}) | {slow / fast:.1f}x |"
        )
    print(f"\nmemory: {statistics.median(memory):.1f} bytes per id (used_memory delta, median)")


if __name__ == "__main__":
    main()
