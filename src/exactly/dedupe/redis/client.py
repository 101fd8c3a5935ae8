"""The redis store's connections to its servers: clients, errors, listpack limits, threads.

Every message names a server by its URL with the password masked (:func:`exactly.urls.redact`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis as redis_client
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from exactly.errors import StoreUnavailable
from exactly.urls import redact

LOG = logging.getLogger("exactly.dedupe.redis")
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
        raise StoreUnavailable(f"redis dedupe store at {redact(url)}: {text}") from None


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
            redact(url),
            error,
        )
    if value < LISTPACK_VALUE:
        LOG.warning(
            "redis %s: hash-max-listpack-value is %d, below the %d bytes of an id: every bucket "
            "becomes a hashtable (about 3x the memory); set it to 64",
            redact(url),
            value,
            LISTPACK_VALUE,
        )
    with _GUARD:
        _LISTPACK[url] = entries
    return entries


def listpack_limit(url: str) -> int:
    """The server's ``hash-max-listpack-entries`` as read by :func:`listpack_entries`."""
    with _GUARD:
        return _LISTPACK.get(url, 128)


def warn_once(url: str, found: int) -> None:
    """Warn (once per server and process) that a bucket outgrew the listpack."""
    with _GUARD:
        if url in _WARNED:
            return
        _WARNED.add(url)
    LOG.warning(
        "redis %s: a bucket holds %d ids, over hash-max-listpack-entries, so it is "
        "a hashtable (about 3x the memory): raise buckets= in the store URL",
        redact(url),
        found,
    )


def as_text(name: bytes | str) -> str:
    return name.decode() if isinstance(name, bytes) else name


def parallel(action: Callable[[Any], list[T]], items: Sequence[Any]) -> list[list[T]]:
    """``action`` on each item, on the shared threads when there are several."""
    if len(items) <= 1:
        return [action(item) for item in items]
    return list(_POOL.map(action, items))
