"""The redis store's configuration: its shards, namespace, window; stats and scope."""

from __future__ import annotations

from typing import Any

from exactly.dedupe.base import Counters, DedupeStore, PartitionStats
from exactly.dedupe.redis.client import as_text, connect, guarded, listpack_entries
from exactly.dedupe.redis.partition import RedisPartition
from exactly.dedupe.redis.sharding import Sharding, partition_position
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError
from exactly.units import format_duration
from exactly.urls import redact

DEFAULT_WINDOW = 24 * 3_600_000


class RedisStore(DedupeStore):
    """Ids of every partition in Redis hashes over the servers of ``sharding`` (module docstring).

    Guarantee: a claim is applied in Redis, atomically with the server's position, when
    :meth:`RedisPartition.claim` returns; a server that loses claims (restart without
    persistence, flush) is detected by its position and rebuilt from the output by the job.
    The window is ``bounds.window`` (bucket TTLs); Redis's ``maxmemory`` is the size bound, so
    run it with ``noeviction`` (an evicted bucket shortens the window silently).
    """

    name = "redis"

    def __init__(
        self,
        sharding: Sharding,
        namespace: str,
        bounds: Bounds | None = None,
        *,
        lock_ttl: float = 10.0,
        lock_timeout: float = 120.0,
        timeout: float = 60.0,
    ) -> None:
        bounds = bounds or Bounds(window=DEFAULT_WINDOW)
        if bounds.max_keys is not None or bounds.max_bytes is not None:
            raise ConfigError(
                "the redis store is bounded by --window (bucket TTLs) and Redis's maxmemory, "
                "not by --max-keys or --max-bytes"
            )
        if bounds.window is None:
            bounds = Bounds(window=DEFAULT_WINDOW)
        if not namespace or any(c.isspace() for c in namespace):
            raise ConfigError(f"redis namespace {namespace!r}: a non-empty word without spaces")
        self.sharding = sharding
        self.namespace = namespace
        self.bounds = bounds
        self.lock_ttl = lock_ttl
        self.lock_timeout = lock_timeout
        self.timeout = timeout

    @property
    def window(self) -> int:
        assert self.bounds.window is not None
        return self.bounds.window

    def prefix(self, partition: int) -> str:
        return f"{self.namespace}:{partition}:"

    @property
    def scope_key(self) -> str:
        """Where each server keeps the scope its ids were packed for."""
        return f"{self.namespace}:scope"

    def _open(self, partition: int) -> RedisPartition:
        return RedisPartition(self, partition)

    def describe(self) -> str:
        current = self.sharding.current
        shards = ",".join(map(redact, current.shards))
        text = (
            f"redis {shards} (namespace {self.namespace}, {current.buckets} "
            f"buckets per {format_duration(current.slot_ms)} slot): window "
            f"{format_duration(self.window)}"
        )
        previous = self.sharding.previous
        if previous is not None and self.sharding.cutover is not None:
            text += f"; before {self.sharding.cutover} ms: {','.join(map(redact, previous.shards))}"
        return text

    def stats(self, partitions: int) -> list[PartitionStats]:
        """Stats without taking the locks (they are read from each server's meta)."""
        return [self._read_stats(partition) for partition in range(partitions)]

    def _read_stats(self, partition: int) -> PartitionStats:
        meta_key = self.prefix(partition) + "meta"
        positions: dict[str, int | None] = {}
        newest: int | None = None
        keys = aged = 0
        oldest: int | None = None
        counters = Counters()
        samples: list[tuple[str, str]] = []
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                meta, clock = client.hgetall(meta_key), client.time()
            now = int(clock[0]) * 1000 + int(clock[1]) // 1000
            fields = {as_text(k): int(v) for k, v in meta.items()}
            positions[url] = fields.get("position")
            if "newest" in fields:
                newest = max(newest or fields["newest"], fields["newest"])
            counters += Counters(
                fields.get("claimed", 0), fields.get("new", 0), fields.get("duplicates", 0)
            )
            aged += fields.get("aged", 0)
            live = [name[2:] for name, value in fields.items() if name[:2] == "x:" and value > now]
            for name, value in fields.items():
                if name[:2] == "x:" and value <= now:
                    aged += fields.get(f"n:{name[2:]}", 0)
            keys += sum(fields.get(f"n:{slot}", 0) for slot in live)
            firsts = [fields[f"t:{slot}"] for slot in live if f"t:{slot}" in fields]
            if firsts:
                oldest = min(firsts) if oldest is None else min(oldest, *firsts)
            if live:
                newest_slot = max(live, key=int)
                samples.append((url, f"{self.prefix(partition)}{newest_slot}:*"))
        return PartitionStats(
            partition,
            keys,
            round(keys * self._bytes_per_id(samples)),
            partition_position(self.sharding, positions, newest, self.window),
            oldest,
            newest,
            aged,
            counters,
        )

    def _bytes_per_id(self, samples: list[tuple[str, str]]) -> float:
        """Bytes per id, from ``MEMORY USAGE`` of a few buckets of each server's newest slot."""
        used = held = 0
        for url, pattern in samples:
            client = connect(url, self.timeout)
            with guarded(url):
                _, found = client.scan(0, match=pattern, count=2000)
                for key in found[:8]:
                    used += client.memory_usage(key, samples=0) or 0
                    held += client.hlen(key)
        return used / held if held else 0.0

    def location(self) -> str:
        return f"namespace {self.namespace} on {','.join(map(redact, self.sharding.servers))}"

    def fresh_hint(self) -> str:
        return "use another namespace (?namespace=NS in the store URL)"

    def _recorded_scope(self, partitions: int) -> str | None:
        found: set[str] = set()
        built = False
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                scope = client.get(self.scope_key)
                if scope is not None:
                    found.add(as_text(scope))
                elif partitions and not built:
                    metas = [self.prefix(partition) + "meta" for partition in range(partitions)]
                    built = bool(client.exists(*metas))
        if found:  # a server without one lost its data (restarted empty): the others say
            return ",".join(sorted(found))
        return "workspace" if built else None  # ids written before scopes existed, or none

    def _record_scope(self, scope: str) -> str:
        found: set[str] = set()
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                client.set(self.scope_key, scope, nx=True)
                found.add(as_text(client.get(self.scope_key) or scope))
        return ",".join(sorted(found))

    def servers(self) -> list[dict[str, Any]]:
        """Per server: memory used, keys, evictions and the listpack limits it has."""
        found = []
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                info: dict[str, Any] = client.info()
                keys = client.dbsize()
            found.append(
                {
                    "url": redact(url),
                    "used_memory": info.get("used_memory"),
                    "keys": keys,
                    "evicted_keys": info.get("evicted_keys"),
                    "listpack_entries": listpack_entries(url, client),
                }
            )
        return found
