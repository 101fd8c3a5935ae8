"""The redis dedupe store (Tapjoy's design): ids in small Redis hashes, sharded over servers.

Modules: ``store.py`` (:class:`RedisStore`, the configuration), ``partition.py`` (one partition
and the claim protocol below), ``transaction.py`` (one server's share of a claim), ``resp.py``
(its commands built from arrays), ``lease.py`` (the partition's lock), ``client.py``
(connections, errors), ``batch.py`` (a batch's ids grouped per server), ``sharding.py``
(placement, pure).

Layout on each server, per namespace (default ``exactly:dedupe:<raw topic>``) and partition *p*
(``sharding.py`` says which server, bucket and slot an id goes to):

* buckets ``<ns>:<p>:<slot>:<bucket>``: hashes of a few hundred ``id (16 bytes) -> offset``, the
  owner's offset as a decimal integer, which a listpack keeps in 3 to 6 bytes (its partition is
  in the key). Small hashes stay listpacks (``hash-max-listpack-entries``, ``-value``: checked at
  open; a claim reads the size of the bucket it gave the most ids, and a warning says when
  buckets outgrow the listpack, so that ``buckets`` can be raised). A bucket expires
  (``PEXPIRE``) one slot after its last id is a window old; so the TTL bounds the window, and
  memory too.
* ``<ns>:<p>:meta``: this server's position for the partition, the newest receive time, counters,
  and per slot the ids written, the earliest receive time and when its buckets expire.
* ``<ns>:<p>:lock``: the partition's lock, on the first current server.
* ``<ns>:scope``: the dedupe scope the ids were packed for (``source`` or ``workspace``), on
  every server: set where missing by each claim's transaction (so a server restarted empty is
  never written to without it) and by the job's start, which checks it; a server without one
  lost its data and takes the others'.

Commit protocol of :meth:`RedisPartition._claim`, one call per batch of records:

1. **Repeats** of an id within the batch are resolved here: the first claim decides for all.
2. **Other epoch** (only while resharding): ids are looked up, read-only, in the epoch that will
   not store them; those found are decided.
3. **Claim**: on every server in play, in parallel, at most :data:`CHUNK` ids per transaction
   (``transaction.py``), in Redis's own commands: ``WATCH`` the server's meta and check that the
   lock is still this holder's and that the server's position is the one this holder last saw (a
   flushed or restarted server fails the call); ``HMGET`` each id in its bucket of every slot of
   the window that holds ids; then in one ``MULTI``/``EXEC`` write the new ids, set TTLs, advance
   the server's position (the last chunk only) and counters. A write to the meta by anyone else
   since the ``WATCH`` makes the ``EXEC`` write nothing, and the call fails.

**Position and durability.** Each server keeps its own position, written atomically with its
claims; the partition's is the least of the servers in play (:func:`sharding.partition_position`).
Redis keeps claims in memory: a server restarted without persistence, or flushed, comes back
without its position, the job rebuilds the store from ``events`` (``recovery.py``) before it
decides anything, and the failed call made the micro-batch fail and retry. Run Redis with AOF
(``appendfsync everysec``) to rebuild less often; correctness does not depend on it.

**Exclusive**: a lock per partition (``SET NX PX`` with a random token, renewed by a thread every
third of its TTL, released by a compare-and-delete); a claim refuses a holder whose lock is gone,
the position check refuses one that another holder overtook, and the ``WATCH`` one that another
holder writes past while it claims. An unreachable server
raises :class:`~exactly.errors.StoreUnavailable`: the micro-batch fails, nothing passes unchecked.
"""

from __future__ import annotations

from exactly.dedupe.redis.client import connect, guarded
from exactly.dedupe.redis.lease import Lease
from exactly.dedupe.redis.partition import CHUNK, RedisPartition
from exactly.dedupe.redis.store import DEFAULT_WINDOW, RedisStore

__all__ = ["CHUNK", "DEFAULT_WINDOW", "Lease", "RedisPartition", "RedisStore", "connect", "guarded"]
