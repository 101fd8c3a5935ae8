"""Window arithmetic of the dedupe stores: pure functions, property-tested.

The *window* is the span during which a repeated messageId is caught. A store bounds what it keeps
by size (keys, bytes) and by age; whichever bound bites first sets the *effective window*, the age
of the oldest id still kept. The rocksdb store keeps ids in *generations* and ages out whole ones,
so its window moves in steps of one generation; these functions decide when a generation starts
and which of the oldest to age out. They touch no store. Durations and sizes are read and printed
by :mod:`exactly.units`.
"""

from __future__ import annotations

from collections.abc import Sequence
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


GENERATIONS = 8  # a bounded window moves in steps of about 1/GENERATIONS of itself


@dataclass(frozen=True)
class Generation:
    """A slice of a store's ids, claimed one after another and aged out together.

    ``earliest`` and ``newest`` are the receive times (ms) of its oldest and newest ids.
    """

    number: int
    keys: int
    earliest: int
    newest: int


def generation_step(allowed: int | None, generations: int = GENERATIONS) -> int | None:
    """Ids a generation holds at most under a key bound; None without one."""
    return None if allowed is None else max(1, allowed // generations)


def opens_generation(
    current: Generation | None,
    allowed: int | None,
    window: int | None,
    newest: int,
    generations: int = GENERATIONS,
) -> bool:
    """Whether a claim call whose newest id was received at ``newest`` starts a new generation.

    The current one is full when it holds ``allowed / generations`` keys or spans
    ``window / generations`` of receive time; without bounds there is one generation.
    """
    if current is None:
        return True
    step = generation_step(allowed, generations)
    full_by_keys = step is not None and current.keys >= step
    full_by_time = window is not None and newest - current.earliest >= max(1, window // generations)
    return full_by_keys or full_by_time


def generation_sizes(keys: int, step: int | None, count: int, most: int = GENERATIONS) -> list[int]:
    """How ``count`` new ids, oldest first, fill generations: the current one (holding ``keys``)
    up to ``step``, then at most ``most`` new ones of ``step`` each, the first of which takes
    what the others cannot hold. Only the last may be partly filled by the call.

    So a restore of a whole window, or a call larger than a step, still ages out in steps: the
    excess lands in the oldest of the new generations, the first to go.
    """
    if step is None:
        return [count]
    first = min(count, max(0, step - keys))
    left = count - first
    new = -(-left // step)  # generations of step ids, the newest maybe partial
    if new <= most:
        return [first] + [step] * (new - 1) + ([left - step * (new - 1)] if new else [])
    return [first, left - step * (most - 1)] + [step] * (most - 1)


def generations_to_drop(
    live: Sequence[Generation], allowed: int | None, incoming: int, cutoff: int | None
) -> int:
    """How many of the oldest generations to age out before a call claims ``incoming`` ids.

    Oldest first, whole: while the kept keys and the incoming ones exceed ``allowed``, or while
    the oldest generation's newest id was received before ``cutoff``. Never the last one, which
    takes the call's ids.
    """
    keys = sum(generation.keys for generation in live)
    dropped = 0
    while dropped < len(live) - 1:
        oldest = live[dropped]
        over = allowed is not None and keys + incoming > allowed
        stale = cutoff is not None and oldest.newest < cutoff
        if not (over or stale):
            break
        keys -= oldest.keys
        dropped += 1
    return dropped


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


def window_in_effect(configured: int, aged: int | None) -> int:
    """The window a partition catches duplicates in (ms): the configured one until the bounds
    age ids out, then the age of its oldest kept id (``aged``) when that is shorter.

    The one definition ``exactly status``, the console and ``exactly up`` show.
    """
    return configured if aged is None else min(configured, aged)


def shortest_window(configured: int, aged: Sequence[int | None]) -> int:
    """The window of a whole job: the shortest of its partitions' (:func:`window_in_effect`)."""
    return min([configured, *(window_in_effect(configured, a) for a in aged)])


def below_minimum(window: int | None, minimum: int | None) -> bool:
    """True when a bounded effective window is shorter than the configured minimum."""
    return window is not None and minimum is not None and window < minimum
