"""Requests per second per client address and source: the table of GCRA states.

Write keys in pages are public, so one page (or a script with its key) could flood a source. Each
source may set a rate (requests per second per client address) and a burst (requests a client may
send at once after being quiet); beyond, the collector answers 429 with ``Retry-After`` and
appends nothing, and the SDKs retry later. The same table, weighted by the bytes a request
stores, limits stored bytes per second (``[collector.byte_limits]``): a gzip body that inflates a
hundredfold costs what it stores, not one request.

The limit itself is :func:`exactly.gcra.police` (GCRA, one number per client: its theoretical
arrival time), the same algorithm the director shapes its sends with. IPv6 clients are limited
per /64, the block one host usually has.

Each worker process keeps its own table: with N workers a client may get up to N times the rate
(its keep-alive connection stays on one worker, so in practice one). The table is bounded: when
full, clients back to an empty bucket are forgotten first (forgetting them changes nothing),
then the oldest entries.
"""

from __future__ import annotations

import math
import socket

from exactly.gcra import Rate, police, police_cost

__all__ = ["Rate", "RateLimiter", "client_key"]


def client_key(address: str) -> str:
    """The address a limit applies to: an IPv4 address as is, an IPv6 one as its /64 (hex)."""
    if ":" not in address:
        return address
    try:
        packed = socket.inet_pton(socket.AF_INET6, address.partition("%")[0])
    except OSError:
        return address
    if packed[:12] == _V4_MAPPED:
        return socket.inet_ntop(socket.AF_INET, packed[12:])
    return packed[:8].hex() + "::/64"


_V4_MAPPED = bytes(10) + b"\xff\xff"


class RateLimiter:
    """The TATs of one worker's clients, per (source, client address), at most ``max_clients``."""

    def __init__(self, rates: dict[str, Rate], *, max_clients: int = 100_000) -> None:
        self.rates = rates
        self.max_clients = max_clients
        self._tats: dict[tuple[str, str], float] = {}

    def check(self, source: str, address: str | None, now: float, cost: float | None = None) -> int:
        """0 when the request may go on, else the whole seconds to put in ``Retry-After``;
        ``cost``: what the request weighs in the rate's units (bytes), else it counts one."""
        rate = self.rates.get(source)
        if rate is None or address is None:
            return 0
        key = (source, client_key(address))
        tat = self._tats.get(key, 0.0)
        tat, wait = police(tat, now, rate) if cost is None else police_cost(tat, now, rate, cost)
        if wait:
            return max(1, math.ceil(wait))
        if key not in self._tats and len(self._tats) >= self.max_clients:
            self._forget(now)
        self._tats[key] = tat
        return 0

    def __len__(self) -> int:
        return len(self._tats)

    def _forget(self, now: float) -> None:
        """Make room: drop clients whose bucket is empty again, then the oldest, down to 90%."""
        tats = self._tats
        for key in [key for key, tat in tats.items() if tat <= now]:
            del tats[key]
        target = self.max_clients * 9 // 10
        while len(tats) > target:
            del tats[next(iter(tats))]
