"""Where the redis store puts an id: shards, buckets, time slots and configuration epochs (pure).

An id claimed at receive time *t* lives in one Redis hash, its *bucket*, named
``<namespace>:<partition>:<slot>:<bucket>`` on one shard:

* ``slot = t // slot_ms``: buckets are grouped by receive time, so a bucket's TTL, counted from
  the end of its slot, bounds the window (the redis store sets it).
* ``bucket`` and ``shard`` come from one 64-bit hash of the 16-byte id (:func:`id_hash`): the low
  32 bits pick the bucket, the high 32 bits the shard, so the two are independent.

A receive time is never the same twice for a duplicate, so a lookup checks every slot that can
hold an id received within the window (:func:`lookup_slots`).

**Epochs.** A :class:`Sharding` has a *current* :class:`Epoch` (shards, buckets, slot length)
and optionally a *previous* one with a *cutover* time: ids received before the cutover were
placed by the previous epoch and are looked up there, ids received from the cutover on by the
current one (Tapjoy's previous and current configurations). Adding a shard is a new epoch whose
cutover is now or later: no key moves, and once the cutover is a window old the previous epoch
can be dropped from the configuration.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exactly.errors import ConfigError
from exactly.units import parse_duration

MASK = (1 << 64) - 1
DEFAULT_BUCKETS = 1024
DEFAULT_SLOT = 3 * 3_600_000


def mix64(value: int) -> int:
    """SplitMix64's finaliser: every input bit flips about half the output bits."""
    value &= MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK
    return value ^ (value >> 31)


def id_hash(packed: bytes) -> int:
    """The 64-bit hash of a 16-byte id; UUIDv1/v7 ids, ordered in time, spread evenly too."""
    high = int.from_bytes(packed[:8], "big")
    low = int.from_bytes(packed[8:16], "big")
    return mix64(high ^ mix64(low))


def id_hashes(packed: bytes) -> Any:
    """:func:`id_hash` of each id of ``packed`` (ids of 16 bytes, concatenated), as numpy."""
    import numpy as np

    halves = np.frombuffer(packed, dtype=">u8").astype(np.uint64).reshape(-1, 2)
    return _mix64_array(halves[:, 0] ^ _mix64_array(halves[:, 1]))


def _mix64_array(values: Any) -> Any:
    import numpy as np

    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def bucket_of(hashed: int, buckets: int) -> int:
    return (hashed & 0xFFFFFFFF) % buckets


def shard_of(hashed: int, shards: int) -> int:
    return (hashed >> 32) % shards


@dataclass(frozen=True)
class Epoch:
    """One shard configuration: server URLs, buckets per slot and partition, slot length (ms)."""

    shards: tuple[str, ...]
    buckets: int = DEFAULT_BUCKETS
    slot_ms: int = DEFAULT_SLOT

    def __post_init__(self) -> None:
        if not self.shards:
            raise ConfigError("the redis store needs at least one server: redis://HOST:PORT")
        if len(set(self.shards)) != len(self.shards):
            raise ConfigError(f"a redis server is listed twice: {', '.join(self.shards)}")
        if self.buckets < 1 or self.slot_ms < 1:
            raise ConfigError("the redis store's buckets and slot must be positive")

    def slot(self, time: int) -> int:
        return time // self.slot_ms


@dataclass(frozen=True)
class Sharding:
    """The current epoch, and the previous one with the cutover time (ms) when resharding."""

    current: Epoch
    previous: Epoch | None = None
    cutover: int | None = None

    def __post_init__(self) -> None:
        if (self.previous is None) != (self.cutover is None):
            raise ConfigError("the redis store's previous and cutover go together: give both")

    @property
    def servers(self) -> tuple[str, ...]:
        """Every server of both epochs, current first, each once."""
        previous = () if self.previous is None else self.previous.shards
        return tuple(dict.fromkeys(self.current.shards + previous))

    def epoch_at(self, time: int) -> Epoch:
        """The epoch that places an id received at ``time``."""
        if self.previous is not None and self.cutover is not None and time < self.cutover:
            return self.previous
        return self.current

    def in_play(self, oldest: int) -> tuple[Epoch, ...]:
        """The epochs holding ids received from ``oldest`` (ms) on: current first."""
        if self.previous is None or self.cutover is None or oldest >= self.cutover:
            return (self.current,)
        return (self.current, self.previous)


def lookup_slots(sharding: Sharding, epoch: Epoch, start: int, end: int) -> range:
    """The slots of ``epoch`` that may hold ids received in ``[start, end]`` (ms, inclusive).

    Empty when the epoch placed nothing in that span.
    """
    low, high = start, end
    if sharding.previous is not None and sharding.cutover is not None:
        if epoch is sharding.previous:
            high = min(high, sharding.cutover - 1)
        else:
            low = max(low, sharding.cutover)
    if low > high:
        return range(0)
    return range(epoch.slot(low), epoch.slot(high) + 1)


def bucket_ttl(epoch: Epoch, slot: int, window: int, newest: int) -> int:
    """How long (ms from now) a bucket of ``slot`` must live, ``newest`` being the newest receive
    time claimed: until its last id is a window old, plus one slot of grace for lag; at least 1 s.
    """
    return max(1000, (slot + 2) * epoch.slot_ms + window - newest)


def partition_position(
    sharding: Sharding,
    positions: Mapping[str, int | None],
    newest: int | None,
    window: int,
) -> int | None:
    """A partition's position from its shards' own positions (each written with its claims).

    The least position of the shards in play: every current shard, and the previous epoch's
    while the window reaches back before the cutover. A shard without one lost its data
    (flushed, restarted) unless it is a current shard that nothing since the cutover could have
    reached yet. None: nothing claimed, or a shard lost its claims and the job must rebuild.
    """
    if newest is None:
        return None
    required: list[str] = []
    for epoch in sharding.in_play(newest - window):
        required += epoch.shards
    fresh_shards = (
        set(sharding.current.shards)
        - set(() if sharding.previous is None else sharding.previous.shards)
        if sharding.cutover is not None and newest < sharding.cutover
        else set()
    )
    found: list[int] = []
    for url in dict.fromkeys(required):
        position = positions.get(url)
        if position is None:
            if url in fresh_shards:
                continue
            return None
        found.append(position)
    return min(found) if found else None


def parse_urls(values: str | Sequence[str] | None) -> tuple[str, ...]:
    """Server URLs from lists and/or comma-separated text, each checked and kept once."""
    if values is None:
        return ()
    texts = [values] if isinstance(values, str) else list(values)
    urls: list[str] = []
    for text in texts:
        for url in text.split(","):
            url = url.strip()
            if not url:
                continue
            if not url.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError(f"redis URL {url!r}: use redis://HOST:PORT/DB or rediss://")
            if url not in urls:
                urls.append(url)
    return tuple(urls)


def parse_cutover(text: str) -> int:
    """A cutover time in ms since the epoch: ISO 8601 (``2026-11-22T10:00Z``) or ms."""
    cleaned = text.strip()
    if cleaned.isdigit():
        return int(cleaned)
    try:
        moment = datetime.datetime.fromisoformat(cleaned.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(
            f"cutover {text!r}: use an ISO time such as 2026-11-22T10:00Z, or ms"
        ) from None
    if moment.tzinfo is None:
        raise ConfigError(f"cutover {text!r}: give the time zone, e.g. a final Z for UTC")
    return int(moment.timestamp() * 1000)


def sharding_from(
    urls: str | Sequence[str] | None,
    *,
    buckets: int | None = None,
    slot: str | None = None,
    previous: str | Sequence[str] | None = None,
    previous_buckets: int | None = None,
    previous_slot: str | None = None,
    cutover: str | None = None,
) -> Sharding:
    """A :class:`Sharding` from option values; the previous epoch's layout defaults to current."""
    slot_ms = DEFAULT_SLOT if slot is None else parse_duration(slot, "slot")
    current = Epoch(parse_urls(urls), buckets or DEFAULT_BUCKETS, slot_ms)
    before = parse_urls(previous)
    if not before:
        if cutover is not None:
            raise ConfigError("the redis store's cutover needs previous (the shards before it)")
        return Sharding(current)
    if cutover is None:
        raise ConfigError(
            "the redis store's previous needs cutover (when the current shards start)"
        )
    old_slot = slot_ms if previous_slot is None else parse_duration(previous_slot, "previous_slot")
    return Sharding(
        current,
        Epoch(before, previous_buckets or current.buckets, old_slot),
        parse_cutover(cutover),
    )


STORE_URL_OPTIONS = (
    "namespace",
    "buckets",
    "slot",
    "previous",
    "previous_buckets",
    "previous_slot",
    "cutover",
)


def sharding_from_url(url: str) -> tuple[Sharding, str | None]:
    """The shards and namespace of a redis store URL (``exactly.dedupe.open_store``).

    ``redis://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...][/DB][?OPTION=VALUE&...]`` (or
    ``rediss://`` for TLS): each host a shard, sharing the scheme, user info and database. The
    options are :data:`STORE_URL_OPTIONS`; ``previous`` lists the
    previous epoch's hosts (``HOST:PORT,HOST:PORT``) and goes with ``cutover``.
    """
    from urllib.parse import parse_qsl

    from exactly.urls import redact

    scheme, _, rest = url.partition("://")
    if scheme not in ("redis", "rediss") or not rest:
        raise ConfigError(
            f"redis store URL {redact(url)!r}: use redis://HOST:PORT[,HOST:PORT...][/DB][?...]"
        )
    location, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(STORE_URL_OPTIONS))
    if unknown:
        raise ConfigError(
            f"redis store URL {redact(url)!r}: unknown option {unknown[0]!r}; the options are "
            f"{', '.join(STORE_URL_OPTIONS)}"
        )
    userinfo, at, hosts_db = location.rpartition("@")
    hosts, slash, db = hosts_db.partition("/")

    def shards(text: str | None) -> list[str]:
        names = [host.strip() for host in (text or "").split(",") if host.strip()]
        return [f"{scheme}://{userinfo}{at}{host}{slash}{db}" for host in names]

    def number(name: str) -> int | None:
        text = options.get(name)
        if not text:
            return None
        if not text.isdigit():
            raise ConfigError(f"redis store URL option {name}={text!r}: a whole number")
        return int(text)

    sharding = sharding_from(
        shards(hosts),
        buckets=number("buckets"),
        slot=options.get("slot") or None,
        previous=shards(options.get("previous")),
        previous_buckets=number("previous_buckets"),
        previous_slot=options.get("previous_slot") or None,
        cutover=options.get("cutover") or None,
    )
    return sharding, options.get("namespace") or None
