"""The main loop's chores and how often each comes round: pure, so tested with a pinned clock.

The director's loop wakes about once a second; renewing the leases, applying operators'
controls, archiving and refreshing the metrics each have their own interval. One
:class:`Schedule` says which are due, instead of a timestamp field per chore.
"""

from __future__ import annotations

from collections.abc import Mapping


class Schedule:
    """Chores with the seconds between two runs of each. Every chore is due at the first
    :meth:`due`; after that, once its interval has passed since it last came round."""

    def __init__(self, intervals: Mapping[str, float]) -> None:
        self.intervals = dict(intervals)
        self._last: dict[str, float | None] = dict.fromkeys(self.intervals)

    def due(self, now: float) -> list[str]:
        """The chores due at ``now``, in the order they were given, each counted as run."""
        chores = []
        for chore, interval in self.intervals.items():
            last = self._last[chore]
            if last is None or now - last >= interval:
                self._last[chore] = now
                chores.append(chore)
        return chores

    def missed(self, chore: str) -> None:
        """``chore`` was due but could not run (its work still under way, or not this
        director's to do): due again at the next :meth:`due`."""
        self._last[chore] = None

    def postpone(self, chore: str, now: float, seconds: float) -> None:
        """``chore`` failed at ``now``: due again ``seconds`` from then, not at its interval."""
        self._last[chore] = now + seconds - self.intervals[chore]
