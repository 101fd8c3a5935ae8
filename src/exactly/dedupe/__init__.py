"""Dedupe: the stores that remember which record owns each messageId, and the job raw -> events.

A backend family: the store interface and its contract in ``base.py``; one module per store
beside it (``rocksdb.py``, ``redis/``), opened by URL with :func:`open_store`, which imports the
store only when asked for; the Spark job in ``job.py``. Spark's own state (``spark_state.py``)
is not a store but the job's other mode, which the job's plan picks (``job.DedupePlan.mode``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exactly.dedupe.base import (
    Claim,
    Counters,
    DedupeStore,
    PartitionStats,
    Status,
    StorePartition,
    Verdict,
)
from exactly.dedupe.window import Bounds
from exactly.errors import ConfigError, EnvironmentProblem
from exactly.urls import redact

__all__ = [
    "BACKENDS",
    "Claim",
    "Counters",
    "DedupeStore",
    "PartitionStats",
    "Status",
    "StorePartition",
    "Verdict",
    "open_store",
]

BACKENDS = ("rocksdb", "redis")  # URL schemes; the contract suite runs on each
HELP = "use rocksdb://DIR or redis://HOST:PORT[,HOST:PORT...][/DB][?namespace=...]"


def open_store(url: str, bounds: Bounds | None = None, **options: Any) -> DedupeStore:
    """The dedupe store at ``url``, keeping what ``bounds`` allow; ``options`` go to the store.

    * ``rocksdb://DIR``: one RocksDB per raw partition under DIR (``rocksdb:///abs/dir``);
    * ``redis://HOST:PORT[,HOST:PORT...][/DB][?namespace=NS&buckets=N&slot=3h&previous=HOST:PORT
      &cutover=TIME...]`` (``rediss://`` for TLS): the sharded redis store
      (:func:`exactly.dedupe.redis.sharding.sharding_from_url`); the namespace defaults to
      ``options["namespace"]``.

    ``spark-state`` is no store (the dedupe job's other mode: ``job.DedupePlan.mode``).
    """
    scheme, _, rest = url.partition("://")
    if scheme == "rocksdb":
        if not rest or rest == "/":
            raise ConfigError(f"dedupe store URL {url!r}: name a directory, rocksdb:///path/dir")
        from exactly.dedupe.rocksdb import RocksDBStore

        return RocksDBStore(Path(rest), bounds, **options)
    if scheme in ("redis", "rediss"):
        try:
            from exactly.dedupe.redis import RedisStore
        except ImportError as error:  # pragma: no cover - depends on the installed extras
            raise EnvironmentProblem(
                f"the redis dedupe store needs the redis extra: pip install 'exactly[redis]' "
                f"({error})"
            ) from error
        from exactly.dedupe.redis.sharding import sharding_from_url

        sharding, namespace = sharding_from_url(url)
        options = dict(options)
        default = options.pop("namespace", None)
        if namespace is None and default is None:
            raise ConfigError(
                f"dedupe store URL {redact(url)!r}: name the keys' namespace, ?namespace=NAME"
            )
        return RedisStore(sharding, namespace or default, bounds, **options)
    if scheme == "spark-state":
        raise ConfigError(
            f"dedupe store URL {url!r}: spark-state keeps Spark's own state, no store to open "
            "(the dedupe job runs it as a mode of its own)"
        )
    raise ConfigError(f"dedupe store URL {redact(url)!r} is not understood: {HELP}")
