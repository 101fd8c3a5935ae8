"""Window arithmetic of the dedupe stores: pure functions, property-tested.

The *window* is the span during which a repeated messageId is caught. A store bounds what it keeps
by size (keys, bytes) and by age; whichever bound bites first sets the *effective window*, the age
of the oldest id still kept. These functions decide how many of the oldest ids to age out; they
touch no store. Durations and sizes are read and printed by :mod:`exactly.units`.
"""

from __future__ import annotations

from dataclasses import dataclass

from exactly.errors import ConfigError


@dataclass(frozen=True)
class Bounds:
    """What a store keeps at most: ``max_keys`` ids, about ``max_bytes`` bytes, ``window`` ms.

    None means unbounded. The byte bound is converted to keys with the store's measured bytes
    per key, so it holds approximately (on disk, deletions are reclaimed by compaction).
    """

    max_keys: int | None = None
    max_bytes: int | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_keys", "max_bytes", "window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"the dedupe store's {name} must be positive, not {value}")


def keys_allowed(bounds: Bounds, keys: int, size: int, default_key_bytes: int = 48) -> int | None:
    """How many keys the size bounds allow, given ``keys`` kept in ``size`` bytes; None: any.

    Bytes per key are measured when there are enough keys to measure (1000), else assumed to
    be ``default_key_bytes``.
    """
    allowed = bounds.max_keys
    if bounds.max_bytes is not None:
        per_key = size / keys if keys >= 1000 and size > 0 else default_key_bytes
        by_bytes = max(1, int(bounds.max_bytes / per_key))
        allowed = by_bytes if allowed is None else min(allowed, by_bytes)
    return allowed


def overflow(allowed: int | None, keys: int, incoming: int) -> int:
    """How many of the oldest keys to age out so ``keys + incoming`` fits in ``allowed``.

    Never more than ``keys``: the ids of the incoming batch themselves are never aged out by it.
    """
    if allowed is None:
        return 0
    return max(0, min(keys, keys + incoming - allowed))


def time_cutoff(bounds: Bounds, newest: int) -> int | None:
    """Ids received before this time (ms) are outside the window; None without a time bound.

    ``newest`` is the receive time of the newest record claimed, not the wall clock, so a job
    catching up on old records does not age out what it still needs.
    """
    return None if bounds.window is None else newest - bounds.window


def effective_window(oldest: int | None, now: int, bounded: bool) -> int | None:
    """The age of the oldest kept id at ``now``; None while nothing was aged out (unbounded)."""
    if oldest is None or not bounded:
        return None
    return max(0, now - oldest)


def below_minimum(window: int | None, minimum: int | None) -> bool:
    """True when a bounded effective window is shorter than the configured minimum."""
    return window is not None and minimum is not None and window < minimum
