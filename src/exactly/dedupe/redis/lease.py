"""A partition's lock in Redis: ``SET NX PX`` with a random token, renewed until released."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time

import redis as redis_client
from redis.exceptions import RedisError

from exactly.backoff import backoff
from exactly.dedupe.redis.client import guarded
from exactly.errors import StoreUnavailable
from exactly.urls import redact

RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


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
        attempt = 0
        while True:
            with guarded(self.url):
                if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                    break
            if time.monotonic() >= deadline:
                raise StoreUnavailable(
                    f"redis dedupe store at {redact(self.url)}: {self.key} is held by another "
                    f"task for over {timeout:.0f} s (another dedupe job on the same namespace?)"
                )
            attempt += 1
            time.sleep(backoff(attempt, minimum=0.01, maximum=0.25))
        self._thread = threading.Thread(target=self._renew, name=f"lease {self.key}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            try:
                if not self.client.eval(RENEW, 1, self.key, self.token, self.ttl_ms):
                    return  # lost: the claim refuses this holder from now on
            except RedisError:
                continue  # the next claim reports the server; keep trying meanwhile

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(RedisError):  # else it expires by itself
            self.client.eval(RELEASE, 1, self.key, self.token)
