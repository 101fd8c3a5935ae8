"""The redis dedupe store (Tapjoy's design): ids in small Redis hashes, sharded over servers.

Layout on each server, per namespace (default ``exactly:dedupe:<raw topic>``) and partition *p*
(``sharding.py`` says which server, bucket and slot an id goes to):

* buckets ``<ns>:<p>:<slot>:<bucket>``: hashes of a few hundred ``id (16 bytes) -> offset``, the
  owner's offset as a decimal integer, which a listpack keeps in 3 to 6 bytes (its partition is
  in the key). Small hashes stay listpacks (``hash-max-listpack-entries``, ``-value``: checked at
  open; the script reports the largest bucket it wrote, and a warning says when buckets outgrow
  the listpack, so that ``--redis-buckets`` can be raised). A bucket expires (``PEXPIRE``) one
  slot after its last id is a window old; so the TTL bounds the window, and memory too.
* ``<ns>:<p>:meta``: this server's position for the partition, the newest receive time, counters,
  and per slot the ids written, the earliest receive time and when its buckets expire.
* ``<ns>:<p>:lock``: the partition's lock, on the first current server.
* ``<ns>:scope``: the dedupe scope the ids were packed for (``source`` or ``workspace``), on
  every server, checked before the job starts.

Commit protocol of :meth:`RedisPartition._claim`, one call per batch of records:

1. **Repeats** of an id within the batch are resolved here: the first claim decides for all.
2. **Other epoch** (only while resharding): ids are looked up, read-only, in the epoch that will
   not store them; those found are decided.
3. **Claim**: one Lua script per server (``claim.lua``, loaded once, called by SHA, reloaded on
   ``NOSCRIPT``), all servers in parallel, at most :data:`CHUNK` ids per call. Atomically on its
   server, the script checks the lock and that the server's position is the one this holder last
   saw (a flushed or restarted server fails the call), reads each id's buckets in every slot of the
   window, writes the new ids, sets TTLs, advances the server's position and counters (the last
   chunk only), and returns only the ids it found.

**Position and durability.** Each server keeps its own position, written atomically with its
claims; the partition's is the least of the servers in play (:func:`sharding.partition_position`).
Redis keeps claims in memory: a server restarted without persistence, or flushed, comes back
without its position, the job rebuilds the store from ``events`` (``recovery.py``) before it
decides anything, and the failed call made the micro-batch fail and retry. Run Redis with AOF
(``appendfsync everysec``) to rebuild less often; correctness does not depend on it.

**Exclusive**: a lock per partition (``SET NX PX`` with a random token, renewed by a thread every
third of its TTL, released by a compare-and-delete); the claim script refuses a holder whose lock
is gone, and the position check refuses one that another holder overtook. An unreachable server
raises :class:`~exactly.errors.StoreUnavailable`: the micro-batch fails, nothing passes unchecked.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import redis as redis_client
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from exactly.dedupe.base import (
    Claim,
    Counters,
    DedupeStore,
    PartitionStats,
    StorePartition,
)
from exactly.dedupe.redis_batch import Batch
from exactly.dedupe.sharding import Epoch, Sharding, lookup_slots, partition_position
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError, StoreUnavailable
from exactly.units import format_duration

LOG = logging.getLogger(__name__)
SCRIPT = (Path(__file__).parent / "claim.lua").read_text()
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()
RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
CHUNK = 100_000  # ids per script call: keeps a call well under Redis's busy-script limit (5 s)
DEFAULT_WINDOW = 24 * 3_600_000
LISTPACK_VALUE = 16  # the longest field: a 16-byte id
_CLIENTS: dict[tuple[str, float], redis_client.Redis] = {}
_LISTPACK: dict[str, int] = {}  # hash-max-listpack-entries per server, read once per process
_WARNED: set[str] = set()
_GUARD = threading.Lock()
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="exactly-redis")
T = TypeVar("T")


def connect(url: str, timeout: float = 60.0) -> redis_client.Redis:
    """The process's client of ``url`` (a pool of connections, safe across threads and forks)."""
    with _GUARD:
        found = _CLIENTS.get((url, timeout))
        if found is None:
            found = redis_client.Redis.from_url(
                url, socket_timeout=timeout, socket_connect_timeout=5, health_check_interval=30
            )
            _CLIENTS[(url, timeout)] = found
        return found


@contextlib.contextmanager
def guarded(url: str) -> Iterator[None]:
    """Any Redis failure on server ``url`` as :class:`StoreUnavailable` (the batch fails)."""
    try:
        yield
    except RedisError as error:
        text = str(error).removeprefix("EXACTLY ")
        raise StoreUnavailable(f"redis dedupe store at {url}: {text}") from None


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

    def _open(self, partition: int) -> RedisPartition:
        return RedisPartition(self, partition)

    def describe(self) -> str:
        current = self.sharding.current
        text = (
            f"redis {','.join(current.shards)} (namespace {self.namespace}, {current.buckets} "
            f"buckets per {format_duration(current.slot_ms)} slot): window "
            f"{format_duration(self.window)}"
        )
        previous = self.sharding.previous
        if previous is not None and self.sharding.cutover is not None:
            text += f"; before {self.sharding.cutover} ms: {','.join(previous.shards)}"
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
            fields = {_text(k): int(v) for k, v in meta.items()}
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
        return f"namespace {self.namespace} on {','.join(self.sharding.servers)}"

    def fresh_hint(self) -> str:
        return "use another --redis-namespace (EXACTLY_DEDUPE__REDIS_NAMESPACE)"

    def _recorded_scope(self, partitions: int) -> str | None:
        found: set[str] = set()
        built = False
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                scope = client.get(f"{self.namespace}:scope")
                if scope is not None:
                    found.add(_text(scope))
                elif partitions and not built:
                    metas = [self.prefix(partition) + "meta" for partition in range(partitions)]
                    built = bool(client.exists(*metas))
        if built:
            found.add("workspace")  # ids written before scopes existed
        return ",".join(sorted(found)) or None

    def _record_scope(self, scope: str) -> str:
        found: set[str] = set()
        for url in self.sharding.servers:
            client = connect(url, self.timeout)
            with guarded(url):
                client.set(f"{self.namespace}:scope", scope, nx=True)
                found.add(_text(client.get(f"{self.namespace}:scope") or scope))
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
                    "url": url,
                    "used_memory": info.get("used_memory"),
                    "keys": keys,
                    "evicted_keys": info.get("evicted_keys"),
                    "listpack_entries": listpack_entries(url, client),
                }
            )
        return found


def listpack_entries(url: str, client: redis_client.Redis) -> int:
    """``hash-max-listpack-entries`` of a server (read once), warning when ids would not fit."""
    with _GUARD:
        known = _LISTPACK.get(url)
    if known is not None:
        return known
    entries, value = 128, 64  # Redis's defaults, assumed where CONFIG is not allowed
    try:
        config: Any = client.config_get("hash-max-*")
        entries = int(config.get("hash-max-listpack-entries", entries))
        value = int(config.get("hash-max-listpack-value", value))
    except (RedisConnectionError, RedisTimeoutError):
        return entries  # unreachable: the lock or the claim says so; read it next time
    except RedisError as error:
        LOG.info(
            "redis %s: cannot read its hash-max-listpack settings (%s); assuming defaults",
            url,
            error,
        )
    if value < LISTPACK_VALUE:
        LOG.warning(
            "redis %s: hash-max-listpack-value is %d, below the %d bytes of an id: every bucket "
            "becomes a hashtable (about 3x the memory); set it to 64",
            url,
            value,
            LISTPACK_VALUE,
        )
    with _GUARD:
        _LISTPACK[url] = entries
    return entries


class Lease:
    """A partition's lock: ``SET NX PX`` with a random token, renewed until released."""

    def __init__(self, url: str, client: redis_client.Redis, key: str, ttl: float) -> None:
        self.url, self.client, self.key = url, client, key
        self.token = secrets.token_hex(16)
        self.ttl_ms = max(1000, int(ttl * 1000))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pause = 0.01
        while True:
            with guarded(self.url):
                if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                    break
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"redis dedupe store at {self.url}: {self.key} is held by another task for "
                    f"over {timeout:.0f} s (another dedupe job on the same namespace?)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not self.client.eval(RENEW, 1, self.key, self.token, self.ttl_ms):
                    return  # lost: the claim script refuses this holder from now on
            except RedisError:
                continue  # the next claim reports the server; keep trying meanwhile

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(RedisError):  # else it expires by itself
            self.client.eval(RELEASE, 1, self.key, self.token)


class RedisPartition(StorePartition):
    """One partition of a :class:`RedisStore`, locked until :meth:`close`."""

    def __init__(self, store: RedisStore, partition: int) -> None:
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
            owners[index] = self._prefix + offset.to_bytes(6, "big")
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
                owners[index] = self._prefix + offset.to_bytes(6, "big")
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
            if reply[1] > _LISTPACK.get(url, 128) and url not in _WARNED:
                _WARNED.add(url)
                LOG.warning(
                    "redis %s: a bucket holds %d ids, over hash-max-listpack-entries, so it is "
                    "a hashtable (about 3x the memory): raise --redis-buckets",
                    url,
                    reply[1],
                )
            for at in range(2, len(reply), 2):
                found.append((int(ordered[reply[at] - 1]), int(reply[at + 1])))
        return found


def _text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name


def evalsha(client: redis_client.Redis, args: Sequence[Any]) -> Any:
    """The claim script by its SHA, loaded into the server when it does not know it."""
    try:
        return client.evalsha(SCRIPT_SHA, 0, *args)
    except NoScriptError:
        client.script_load(SCRIPT)
        return client.evalsha(SCRIPT_SHA, 0, *args)


def parallel(action: Callable[[Any], list[T]], items: Sequence[Any]) -> list[list[T]]:
    """``action`` on each item, on the shared threads when there are several."""
    if len(items) <= 1:
        return [action(item) for item in items]
    return list(_POOL.map(action, items))
