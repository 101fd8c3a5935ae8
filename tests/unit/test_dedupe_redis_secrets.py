"""The redis store never shows a password: describe, location, errors, warnings, servers."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from redis.exceptions import RedisError

from exactly.dedupe import open_store
from exactly.dedupe.redis import Lease, RedisStore, guarded
from exactly.dedupe.redis import client as redis_client_module
from exactly.dedupe.redis import store as redis_store_module
from exactly.errors import StoreUnavailable

SECRET = "s3cret-pw"
URL = f"redis://:{SECRET}@127.0.0.1:6390,127.0.0.1:6391/0?namespace=ns&previous=127.0.0.1:6392&cutover=1000"


class FakeClient:
    """Enough of a Redis client: a lock that is always held, a server that answers INFO."""

    def set(self, *args: Any, **kwargs: Any) -> bool:
        return False

    def info(self) -> dict[str, Any]:
        return {"used_memory": 1, "evicted_keys": 0}

    def dbsize(self) -> int:
        return 0

    def config_get(self, pattern: str) -> dict[str, str]:
        return {"hash-max-listpack-entries": "128", "hash-max-listpack-value": "8"}


def store() -> RedisStore:
    opened = open_store(URL)
    assert isinstance(opened, RedisStore)
    assert all(SECRET in url for url in opened.sharding.servers)  # the clients get it
    return opened


def test_describe_and_location_mask_the_password() -> None:
    opened = store()
    for text in (opened.describe(), opened.location()):
        assert SECRET not in text and "***" in text


def test_errors_mask_the_password() -> None:
    url = store().sharding.servers[0]
    with pytest.raises(StoreUnavailable) as raised, guarded(url):
        raise RedisError("connection refused")
    assert SECRET not in str(raised.value) and "connection refused" in str(raised.value)
    lease = Lease(url, FakeClient(), "ns:0:lock", ttl=1)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable) as held:
        lease.acquire(timeout=0)
    assert SECRET not in str(held.value) and "held by another task" in str(held.value)


def test_warnings_and_servers_mask_the_password(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    opened = store()
    monkeypatch.setattr(redis_store_module, "connect", lambda url, timeout: FakeClient())
    monkeypatch.setattr(redis_client_module, "_LISTPACK", {})
    monkeypatch.setattr(redis_client_module, "_WARNED", set())
    with caplog.at_level(logging.INFO, logger="exactly.dedupe.redis"):
        servers = opened.servers()
        redis_client_module.warn_once(opened.sharding.servers[0], 500)
    assert [server["url"] for server in servers] == [
        "redis://:***@127.0.0.1:6390/0",
        "redis://:***@127.0.0.1:6391/0",
        "redis://:***@127.0.0.1:6392/0",
    ]
    assert len(caplog.records) == 4  # the listpack value of each server, the big bucket
    assert all(SECRET not in record.getMessage() for record in caplog.records)
